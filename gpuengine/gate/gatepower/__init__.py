"""`./gate gatepower`: measure the regression gate's power and learn its noise.

    trials.py       inside a perf test of a study session: trials at injected slowdowns, their files
    sessions.py     the pytest sessions (separate processes) a study or calibration runs
    analysis.py     false-alarm and detection rates per test from the trials
    calibration.py  per-test run-to-run noise from unchanged trials -> noise.json
    cli.py          the command line
"""
