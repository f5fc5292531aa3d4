"""The store of runs (baselines_store/): the one reader of a run file (stored_runs), how a run is saved, written
aside and renamed (run_storage), and how a spread's per-GPU runs merge into one (spread_runs)."""
