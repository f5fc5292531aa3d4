"""scripts/plan_rules.py replays choice rules on the stored plan-stability records: the figures docs/gate.md cites."""
from __future__ import annotations

from pathlib import Path

from .script_module import load_script

REPO = Path(__file__).resolve().parents[1]


def test_the_stored_h100_pairs_give_the_figures_docs_cite(capsys):
    assert load_script("plan_rules").main([]) == 0
    table = capsys.readouterr().out
    assert "260 choices from 2 records" in table
    assert "margin 2%               248/260    95.4%   0.26%   125/130, 123/130" in table
    assert "margin 5%               249/260    95.8%   0.69%   126/130, 123/130" in table
    assert "engine 2% knobs 5%      252/260    96.9%   0.64%   127/130, 125/130" in table
    assert "107 cuDNN graphs from 20261127_1856_76b5946" in table and "built them in 75.6 s" in table
    assert "4       104/107        12       30.4 s       +0.36%" in table


def test_the_stored_h200_pairs_give_the_figures_docs_cite(capsys, tmp_path):
    folder = REPO / "baselines_store" / "nvidia-h200" / "plan_stability"
    for stamp in ("20261129_0105_ee494c8", "20261129_0124_51a1156"):   # the two pairs made at a cap of 8
        (record,) = folder.glob(f"{stamp}_*.json")
        (tmp_path / record.name).write_bytes(record.read_bytes())
    assert load_script("plan_rules").main([str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "260 choices from 2 records" in table
    assert "margin 2%               237/260    91.2%   0.26%   118/130, 119/130" in table
    assert "engine 2% knobs 5%      255/260    98.1%   0.68%   128/130, 127/130" in table
    assert "built them in 228.1 s" in table and "4       211/214        10       90.7 s       +0.09%" in table
    assert load_script("plan_rules").main([str(folder)]) == 0   # with the pair the rule in force made itself
    assert "engine 2% knobs 5%      382/390    97.9%   0.62%   128/130, 127/130, 127/130" in capsys.readouterr().out


def test_a_folder_without_records_says_so(tmp_path, capsys):
    assert load_script("plan_rules").main([str(tmp_path)]) == 2
    assert "no record with two runs' timings" in capsys.readouterr().err
