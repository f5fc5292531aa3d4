"""gpuengine.bench.cli_args: each argument check names the value and what is allowed, and accepts its ends.

The commands' own probes (which argument, which command) are in test_*_cli.py
beside each command; here the checks themselves. The checks of output places
run as root on lent machines, where permissions do not refuse: a path under a
file stands for a forbidden place, and `os.access` is stubbed for the rest.
"""
from __future__ import annotations

import argparse

import pytest

from gpuengine.bench import cli_args
from gpuengine.bench.cli_args import (UsageError, checked, number, output_file, output_folder, replaced_folder,
                                      whole)


@pytest.mark.parametrize("low,high,text,allowed", [
    (1, None, "0", "a whole number >= 1"), (1, None, "-3", "a whole number >= 1"),
    (1, None, "two", "a whole number >= 1"), (1, None, "1.5", "a whole number >= 1"),
    (1, 10, "11", "a whole number from 1 to 10"), (0, 1024, "99999999999999999999", "a whole number from 0 to 1024")])
def test_whole_refuses_naming_the_value_and_the_range(low, high, text, allowed):
    with pytest.raises(argparse.ArgumentTypeError, match=f"^'{text}' is not accepted; use {allowed}$"):
        whole(low, high)(text)


def test_whole_accepts_both_ends():
    assert [whole(1, 10)(t) for t in ("1", " 10 ")] == [1, 10]


@pytest.mark.parametrize("kwargs,text,allowed", [
    ({"low": 0, "low_open": True}, "0", "a number > 0"), ({"low": 0, "low_open": True}, "-5", "a number > 0"),
    ({"low": 0, "low_open": True}, "nan", "a number > 0"), ({"low": 0, "low_open": True}, "inf", "a number > 0"),
    ({"low": 0, "low_open": True}, "soon", "a number > 0"), ({"low": 0}, "-1", "a number >= 0"),
    ({"low": 0, "high": 1, "low_open": True, "high_open": True}, "1", "a number > 0 and < 1"),
    ({"low": 0, "high": 100}, "101", "a number from 0 to 100")])
def test_number_refuses_naming_the_value_and_the_range(kwargs, text, allowed):
    with pytest.raises(argparse.ArgumentTypeError, match=f"^'{text}' is not accepted; use {allowed}$"):
        number(**kwargs)(text)


def test_number_accepts_inside_and_closed_ends():
    assert number(0, 100)("0") == 0 and number(0, 100)("100") == 100 and number(0, low_open=True)("1e-9") == 1e-9


def test_an_output_file_needs_an_existing_writable_folder(tmp_path, monkeypatch):
    assert output_file(str(tmp_path / "out.json")) == tmp_path / "out.json"
    with pytest.raises(argparse.ArgumentTypeError, match=f"'{tmp_path}/no/out.json' cannot be written: its folder "
                                                         f"{tmp_path}/no does not exist"):
        output_file(str(tmp_path / "no" / "out.json"))
    with pytest.raises(argparse.ArgumentTypeError, match=f"'{tmp_path}' is a folder; give the path of a file"):
        output_file(str(tmp_path))
    (tmp_path / "file").write_text("")
    with pytest.raises(argparse.ArgumentTypeError, match=f"cannot be written: {tmp_path}/file is not a folder"):
        output_file(str(tmp_path / "file" / "out.json"))
    monkeypatch.setattr(cli_args.os, "access", lambda path, mode: False)   # as a read-only folder would answer
    with pytest.raises(argparse.ArgumentTypeError, match=f"cannot be written: {tmp_path} is not writable"):
        output_file(str(tmp_path / "out.json"))


def test_output_folders_check_the_place_they_are_made_in(tmp_path, monkeypatch):
    assert output_folder(str(tmp_path / "a" / "b")) == tmp_path / "a" / "b"   # made later, under a writable folder
    (tmp_path / "file").write_text("")
    for check in (output_folder, replaced_folder):
        with pytest.raises(argparse.ArgumentTypeError, match=f"^'{tmp_path}/file' is not a folder$"):
            check(str(tmp_path / "file"))
        with pytest.raises(argparse.ArgumentTypeError, match=f"{tmp_path}/file is not a folder"):
            check(str(tmp_path / "file" / "out"))
    (tmp_path / "report").mkdir()
    writable = {str(tmp_path / "report")}   # the folder itself, not the one it is replaced in
    monkeypatch.setattr(cli_args.os, "access", lambda path, mode: str(path) in writable)
    assert output_folder(str(tmp_path / "report")) == tmp_path / "report"
    with pytest.raises(argparse.ArgumentTypeError, match=f"cannot be written: {tmp_path} is not writable"):
        replaced_folder(str(tmp_path / "report"))


def test_checked_names_the_option():
    with pytest.raises(UsageError, match="^argument --out: '7' is not accepted; use a whole number >= 8$"):
        checked("--out", whole(8), "7")
    assert checked("--out", whole(8), "8") == 8
    assert issubclass(UsageError, ValueError)
