"""`eagle3-console logs`: the tail is bounded on any log (issue 8, item 7), prints
only printable text, and `logs -f` ends with the run (issue 9). Real files,
the CLI as a real subprocess."""

from __future__ import annotations


import pytest

from eagle3_console.cli import logtail
from tests.conftest import stage_cmd

GIB = 1 << 30


def _big_log(path, size=2 * GIB, end=b"") -> None:
    """A sparse file of `size` NUL bytes without one newline (no disk used), then `end`."""
    with open(path, "wb") as fh:
        fh.truncate(size)
        fh.seek(size)
        fh.write(end)


@pytest.mark.timeout(10)
def test_tail_of_a_2_gib_log_without_newlines_is_bounded(tmp_path):
    """Before: the tail prepended 64 KiB blocks until it saw n newlines, i.e.
    it read 2 GiB quadratically (90 s at 100 % CPU, nothing printed)."""
    log = tmp_path / "big.log"
    _big_log(log, end=b"the very end")
    lines = logtail.last_lines(log, 5)
    assert len(lines) == 1
    [line] = lines
    assert line.startswith(logtail.CUT) and line.endswith("the very end")
    # One line capped: MAX_LINE bytes, each NUL escaped to 4 characters, plus the marker.
    assert len(line) < 4 * logtail.MAX_LINE + 200
    assert "\x00" not in line and "\\x00" in line


@pytest.mark.timeout(30)
def test_logs_cli_on_a_2_gib_line_finishes_and_says_it_cut(ws):
    ws.write(f"""
[stages.big]
argv = {stage_cmd("sleeper.py", "--seconds", "0")}
""")
    run = ws.record_finished_run("big", {})
    _big_log(run.log_path, end=b"\nlast words\n")
    proc = ws.cli("logs", "big", "-n", "5", timeout=25)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert out[-1] == "last words"
    assert out[-2].startswith("[line cut: longer than ")


def test_a_long_line_inside_the_window_keeps_head_and_end(tmp_path):
    log = tmp_path / "x.log"
    long = b"HEAD" + b"x" * 100_000 + b"END"
    log.write_bytes(b"first\n" + long + b"\nlast\n")
    lines = logtail.last_lines(log, 3)
    assert lines[0] == "first" and lines[2] == "last"
    assert lines[1].startswith("HEAD") and lines[1].endswith("END")
    assert f"[line cut: {len(long) - logtail.MAX_LINE:,} bytes not shown]" in lines[1]


def test_control_bytes_are_escaped_and_ansi_dropped(tmp_path):
    log = tmp_path / "ctl.log"
    log.write_bytes(b"\x1b[31mred\x1b[0m and \x1b]0;pwned title\x07\n"
                    b"bell\x07 del\x7f c1\xc2\x9b[2J tab\there bad\xff\n"
                    b"progress 1/3\rprogress 3/3\r\n"
                    b"crlf\r\n")
    lines = logtail.last_lines(log, 10)
    text = "\n".join(lines)
    bad = [c for c in text if c != "\n" and c != "\t" and not c.isprintable()]
    assert not bad, bad
    assert lines[0] == "red and \\x1b]0;pwned title\\x07"
    assert lines[1] == "bell\\x07 del\\x7f c1\\x9b[2J tab\there bad\\xff"
    assert lines[2:] == ["progress 3/3", "crlf"]


def test_tail_of_small_and_empty_files(tmp_path):
    log = tmp_path / "s.log"
    assert logtail.last_lines(log, 3) == []          # absent
    log.write_bytes(b"")
    assert logtail.last_lines(log, 3) == []
    log.write_bytes(b"a\nb\nc")
    assert logtail.last_lines(log, 2) == ["b", "c"]
    assert logtail.last_lines(log, 9) == ["a", "b", "c"]
    assert logtail.last_lines(log, 0) == []
    # A window smaller than the file: the first line it holds began before it.
    log.write_bytes(b"0123456789\nabc\n")
    assert logtail.last_lines(log, 5, window=8) == ["[line cut: longer than 3 bytes, its end shown] 789", "abc"]


def test_follow_reads_rotation_truncation_and_ends_with_the_status_line(tmp_path):
    """The printer follows with the monitor's LogFollower; it stops when
    ended() says the run is over and prints what it says last."""
    import io

    log = tmp_path / "f.log"
    log.write_bytes(b"old line\n")
    out = io.StringIO()
    steps = iter([
        lambda: log.open("ab").write(b"new 1\nnew \x1b[1m2\x1b[0m\n"),
        lambda: log.write_bytes(b"after truncation\n"),
        lambda: (log.rename(tmp_path / "f.log.1"), log.write_bytes(b"rotated\x07\npartial")),
    ])
    calls = {"n": 0}

    def ended():
        calls["n"] += 1
        return "run 3 (x) succeeded: exit 0" if calls["n"] > 3 else None

    def sleep(_s):
        next(steps, lambda: None)()

    assert logtail.follow(log, out, ended, poll_s=0, sleep=sleep) == "run 3 (x) succeeded: exit 0"
    assert out.getvalue().splitlines() == ["new 1", "new 2", "after truncation", "rotated\\x07", "partial",
                                           "run 3 (x) succeeded: exit 0"]


@pytest.mark.timeout(60)
def test_logs_follow_exits_when_the_run_ends(ws):
    """Before: `logs -f` kept waiting after the run ended (only ^C stopped it)."""
    ws.write(f"""
[stages.slow]
argv = {stage_cmd("sleeper.py", "--seconds", "2")}
""")
    ws.cli("run", "slow", check=0)
    proc = ws.cli("logs", "slow", "-f", timeout=45)
    assert proc.returncode == 0, proc.stderr
    run = ws.latest("slow")
    assert run.status == "succeeded"
    assert proc.stdout.splitlines()[-1] == f"run {run.id} (slow) succeeded: exit 0"
    assert "done" in proc.stdout
    # It ended because the run did: its last line is the run's recorded end (a `logs -f` that
    # kept waiting would have met ws.cli's timeout instead; no wall clock asserted).
    assert run.ended is not None
