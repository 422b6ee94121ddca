"""Hostile input for the job ledger: damaged or unusable ledger files, out-of-range numbers, unknown
job kinds, resuming what is not paused, and two jobs on one output. Each refusal is one line, exit 2
from the CLI, and leaves every file as it was."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hostile import assert_refused, untouched

from vidgen.cli import main
from vidgen.errors import InputError
from vidgen.queue.file_errors import DAMAGED, file_error_fix
from vidgen.queue.jobs import JOB_KINDS
from vidgen.queue.ledger import Control, JobSpec, JobState, Ledger


def spec(name: str = "", **kw) -> JobSpec:
    return JobSpec(kind=kw.pop("kind", "render"), payload=kw.pop("payload", {}), name=name, **kw)


def queue(db, *args: str) -> int:
    return main(["queue", "--db", str(db), *args])


@pytest.fixture
def db(tmp_path):
    return tmp_path / "queue.db"


@pytest.fixture
def ledger(db):
    with Ledger(db) as led:
        yield led


@contextmanager
def refused(db, match: str | None = None) -> Iterator[tuple[Ledger, pytest.ExceptionInfo]]:
    """A Ledger on `db` whose call in the block must raise InputError (one line) and change no file.
    The ledger is closed before the files are compared: an open connection's -shm changes with reads."""
    with untouched(db.parent), Ledger(db) as led, pytest.raises(InputError, match=match) as excinfo:
        yield led, excinfo
    assert "\n" not in str(excinfo.value)


def _ledger_with_jobs(path) -> None:
    """A real ledger with a few jobs in it, closed (so no -wal/-shm files are left)."""
    with Ledger(path) as led:
        led.submit([spec(f"job{i}", payload={"pad": "x" * 3000}) for i in range(20)])


# -- 1. ledger files that cannot be used ------------------------------------------------------------


@pytest.mark.parametrize("content", [os.urandom(8192), b"a text file, not a database\n" * 200],
                         ids=["random-bytes", "text"])
def test_a_file_that_is_not_a_database_is_refused_and_kept(tmp_path, capsys, content):
    db = tmp_path / "queue.db"
    db.write_bytes(content)
    for args in (["list"], ["resume", "1"]):
        with untouched(tmp_path):
            code = queue(db, *args)
        assert_refused(code, capsys.readouterr().err, f"cannot use the queue ledger {db}: file is not a database",
                       "move it aside", "--db or VIDGEN_QUEUE")
    assert db.read_bytes() == content


def _corrupt(path, page: int, offset: int = 0) -> None:
    """Overwrite the start of one page (1-based) with garbage, as a bad disk or a stray write would."""
    with sqlite3.connect(path) as con:
        page_size = con.execute("PRAGMA page_size").fetchone()[0]
    con.close()
    with open(path, "r+b") as f:
        f.seek((page - 1) * page_size + offset)
        f.write(b"\xff" * 64)


def test_a_damaged_ledger_is_refused_and_kept(tmp_path, capsys):
    db = tmp_path / "queue.db"
    _ledger_with_jobs(db)
    with sqlite3.connect(db) as con:
        jobs_root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'jobs'").fetchone()[0]
    con.close()
    _corrupt(db, jobs_root)                                 # opens, but its jobs table is garbage
    for args in (["list"], ["show", "1"], ["cancel", "1"], ["pause", "1"]):
        with untouched(tmp_path):
            code = queue(db, *args)
        assert_refused(code, capsys.readouterr().err, f"cannot use the queue ledger {db}: database disk image is "
                       "malformed", "it is left as it is: move it aside")
    with untouched(tmp_path), Ledger(db) as led:            # the check reports the damage instead of failing
        assert "malformed" in led.integrity_check()
    _corrupt(db, 1, offset=100)                             # the schema itself: it does not even open
    with untouched(tmp_path):
        code = queue(db, "list")
    assert_refused(code, capsys.readouterr().err, f"cannot use the queue ledger {db}: ", "malformed", "move it aside")


def test_a_folder_as_the_ledger_is_refused(tmp_path, capsys):
    db = tmp_path / "ledger"
    db.mkdir()
    (db / "keep.txt").write_text("mine")
    with untouched(tmp_path):
        code = queue(db, "list")
    assert_refused(code, capsys.readouterr().err, f"cannot use the queue ledger {db}: it is a folder", "--db")


@pytest.mark.parametrize("where", ["file-in-the-way", "under-a-file", "proc"])
def test_a_folder_that_cannot_be_made_is_refused(tmp_path, capsys, where):
    (tmp_path / "notes").write_text("mine")
    db, folder, why = {
        "file-in-the-way": (tmp_path / "notes" / "q.db", tmp_path / "notes", "a file is in the way"),
        "under-a-file": (tmp_path / "notes" / "sub" / "q.db", tmp_path / "notes" / "sub", "a file is in the way"),
        "proc": ("/proc/vidgen-nope/q.db", "/proc/vidgen-nope", ""),     # procfs: no folder can be made there
    }[where]
    with untouched(tmp_path):
        code = queue(db, "list")
    assert_refused(code, capsys.readouterr().err, f"cannot use the queue ledger {db}: cannot create its folder "
                   f"{folder}: {why}", "give another --db or VIDGEN_QUEUE")


def test_a_file_that_cannot_be_written_is_refused(capsys):
    before = open("/proc/version", "rb").read()
    code = queue("/proc/version", "list")                   # not writable even by root
    assert_refused(code, capsys.readouterr().err, "cannot use the queue ledger /proc/version: ",
                   "give another --db or VIDGEN_QUEUE")
    assert open("/proc/version", "rb").read() == before


def test_a_read_only_ledger_can_be_read_but_not_changed(tmp_path, capsys, monkeypatch):
    """Tests run as root, which writes anywhere: SQLite is made to open the file read-only instead."""
    db = tmp_path / "queue.db"
    _ledger_with_jobs(db)
    connect = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda path, **kw: connect(f"file:{path}?mode=ro", uri=True, **kw))
    # a read-only connection leaves SQLite's -wal/-shm behind (it cannot remove them): make them first
    assert queue(db, "list") == 0 and "job19" in capsys.readouterr().out
    for args in (["cancel", "1"], ["pause", "2"], ["pause"]):
        with untouched(tmp_path):
            code = queue(db, *args)
        assert_refused(code, capsys.readouterr().err, f"cannot use the queue ledger {db}: attempt to write a "
                       "readonly database", "this user can write")
    with untouched(tmp_path), pytest.raises(InputError, match="readonly database"):
        Ledger(db).submit([spec("new")])


def test_another_programs_database_is_refused_and_kept(tmp_path, capsys):
    db = tmp_path / "photos.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, path TEXT)")
        con.execute("INSERT INTO photos (path) VALUES ('a.jpg')")
    con.close()
    with untouched(tmp_path):
        code = queue(db, "list")
    assert_refused(code, capsys.readouterr().err, f"cannot use the queue ledger {db}: it is an SQLite database of "
                   "something else (it has a table 'photos'), not a vidgen queue ledger", "--db")
    with sqlite3.connect(db) as con:                        # not switched to WAL, no tables of ours added
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert [r[0] for r in con.execute("SELECT name FROM sqlite_master")] == ["photos"]
    con.close()


def test_only_errors_of_the_file_become_input_errors(ledger):
    # A mistake in our own SQL is a bug: it keeps its type (and traceback), never "fix your file".
    with pytest.raises(sqlite3.OperationalError, match="no such column"):
        with ledger._use() as db:
            db.execute("SELECT nope FROM jobs")
    assert ledger.integrity_check() == "ok" and ledger.jobs() == []
    # Python 3.10's exceptions carry no sqlite_errorcode: SQLite's message decides there
    assert file_error_fix(sqlite3.DatabaseError("file is not a database")) == DAMAGED
    assert file_error_fix(sqlite3.OperationalError("no such table: jobs")) is None


# -- 2. numbers SQLite cannot hold, and bools -------------------------------------------------------


def test_out_of_range_and_bool_numbers_are_refused_together(db):
    with Ledger(db) as led:
        (first,) = led.submit([spec("first")])
    bad = [spec("a", priority=2**63), spec("b", priority=-2**63 - 1), spec("c", priority=True),
           spec("d", max_attempts=2**63), spec("e", max_attempts=True), spec("f", deps=[True]),
           spec("g", after=[True]), spec("h", after=[2**64])]
    with refused(db) as (led, e):
        led.submit(bad)
    msg = str(e.value)
    for part in ("job 0 (a): priority must be an int from -9223372036854775808 to 9223372036854775807, got "
                 "9223372036854775808", "job 1 (b): priority must be", "job 2 (c): priority must be an int from "
                 "-9223372036854775808 to 9223372036854775807, got True",
                 "job 3 (d): max_attempts must be an int from 1 to 9223372036854775807, got 9223372036854775808",
                 "job 4 (e): max_attempts must be an int from 1", "job 5 (f): deps index True must point at an "
                 "earlier job", "job 6 (g): after entry True must be a job id (an int)",
                 "job 7 (h): after entry 18446744073709551616 must be a job id"):
        assert part in msg
    ledger = Ledger(db)
    assert [j.id for j in ledger.jobs()] == [first]
    low, high = ledger.submit([spec("low", priority=-2**63), spec("high", priority=2**63 - 1, max_attempts=2**63 - 1)])
    assert (ledger.get(low).priority, ledger.get(high).max_attempts) == (-2**63, 2**63 - 1)


# -- 3. job kinds -----------------------------------------------------------------------------------


def test_unknown_job_kinds_are_refused_at_submit(db):
    Ledger(db).close()
    with refused(db) as (led, e):
        led.submit([spec("a", kind="decode"), spec("b", kind=""), spec("c", kind=None), spec("d", kind="stitch")])
    msg = str(e.value)
    for part in ("job 0 (a): kind must be one of render, stitch, contact_sheet, review, got 'decode'",
                 "job 1 (b): kind must be one of render, stitch, contact_sheet, review, got ''",
                 "job 2 (c): kind must be one of render, stitch, contact_sheet, review, got None"):
        assert part in msg
    ledger = Ledger(db)
    assert "job 3" not in msg and ledger.jobs() == []
    assert len(ledger.submit([spec(kind=kind) for kind in JOB_KINDS])) == len(JOB_KINDS) == 4


def test_job_kinds_are_the_ones_the_executor_runs():
    from vidgen.queue.executor import KINDS

    assert set(JOB_KINDS) == set(KINDS)


# -- 4. resume with nothing to resume ---------------------------------------------------------------


def test_resume_refuses_a_job_that_is_not_paused(db):
    with Ledger(db) as ledger:
        a, b, c = ledger.submit([spec("a"), spec("b", deps=[0]), spec("c")])
        assert ledger.claim("w").id == a
    for job_id, state in ((a, "running"), (b, "waiting-on-deps"), (c, "queued")):
        with refused(db, f"^job #{job_id} is {state}, not paused; nothing to resume$") as (led, _):
            led.resume(job_id)
    Ledger(db).cancel(a)                                    # a cancel request is not a pause to undo
    with refused(db, f"^job #{a} is running, not paused; nothing to resume$") as (led, _):
        led.resume(a)
    ledger = Ledger(db)
    assert ledger.get(a).request is Control.CANCEL
    assert [ledger.get(i).state for i in (b, c)] == [JobState.WAITING, JobState.QUEUED]


def test_resume_says_what_it_did(ledger):
    a, b, c = ledger.submit([spec("a"), spec("b"), spec("c", deps=[1])])
    assert ledger.claim("w").id == a
    ledger.pause(a)
    assert ledger.resume(a) == "pause withdrawn" and ledger.heartbeat(a, "w") is Control.CONTINUE
    ledger.pause(b)
    ledger.pause(c)
    assert (ledger.resume(b), ledger.resume(c)) == ("queued", "waiting-on-deps")
    ledger.pause()
    assert ledger.resume() == "queue resumed" and not ledger.is_paused()


def test_cli_resume_of_a_queued_job_is_refused(tmp_path, capsys):
    db = tmp_path / "queue.db"
    with Ledger(db) as led:
        (job_id,) = led.submit([spec("a")])
    with untouched(tmp_path):
        code = queue(db, "resume", str(job_id))
    assert_refused(code, capsys.readouterr().err, f"job #{job_id} is queued, not paused; nothing to resume")


# -- 5. two jobs on one output ----------------------------------------------------------------------


def test_an_output_of_a_live_job_is_refused(db, tmp_path):
    out, b, c = (str(tmp_path / "out" / f"{n}.mp4") for n in "abc")
    with Ledger(db) as ledger:
        running, paused, waiting = ledger.submit([spec("r", output=out), spec("p", output=b),
                                                  spec("w", output=c, deps=[0])])
        ledger.claim("w")
        ledger.pause(paused)
    relative = os.path.relpath(b)                           # compared as absolute paths
    with refused(db) as (led, e):
        led.submit([spec("x", output=out), spec("y", output=relative),
                    spec("z", output=str(tmp_path / "out" / ".." / "out" / "c.mp4"))])
    msg = str(e.value)
    for part in (f"job 0 (x): output {out} is already the output of job #{running} (r), which is running; choose "
                 f"another output path or cancel #{running}",
                 f"job 1 (y): output {b} is already the output of job #{paused} (p), which is paused",
                 f"job 2 (z): output {c} is already the output of job #{waiting} (w), which is waiting-on-deps"):
        assert part in msg
    assert len(Ledger(db).jobs()) == 3


@pytest.mark.parametrize("other", ["x.mkv", "x", "x.webm"])
def test_outputs_that_share_derived_files_are_refused(db, tmp_path, other):
    """x.mp4, x.mkv and the PNG folder x write one x.latents.safetensors and x.resume.safetensors."""
    first, second = str(tmp_path / "x.mp4"), str(tmp_path / other)
    with Ledger(db) as ledger:
        [held] = ledger.submit([spec("first", output=first)])
    latents = str(tmp_path / "x.latents.safetensors")
    with refused(db) as (led, e):
        led.submit([spec("second", output=second)])
    assert (f"job 0 (second): output {second} and {first}, the output of job #{held} (first), which is queued, both "
            f"write {latents} (the latents); choose another output name or cancel #{held}") in str(e.value)
    with refused(db) as (led, e):                                   # within one submission too
        led.submit([spec("a", output=str(tmp_path / "y.mp4")), spec("b", output=str(tmp_path / f"y{other[1:]}"))])
    msg = str(e.value)
    assert "job 1 (b): output" in msg and "the output of job 0 (a) of this submission, both write" in msg
    assert [j.id for j in Ledger(db).jobs()] == [held]
    # A stitch writes only its output: it shares nothing with a render of another name.
    assert Ledger(db).submit([spec("s", kind="stitch", output=str(tmp_path / "x.latents.mp4"))])
    with Ledger(db) as ledger:                                      # once the first has ended, the name is free
        ledger.cancel(held)
        assert ledger.submit([spec("second", output=second)])


def test_an_edit_cannot_take_another_jobs_files(db, tmp_path):
    with Ledger(db) as ledger:
        a, b = ledger.submit([spec("a", output=str(tmp_path / "a.mp4")), spec("b", output=str(tmp_path / "b.mp4"))])
        with pytest.raises(InputError) as e:
            ledger.update(b, payload={}, output=str(tmp_path / "a.mkv"))
        assert str(e.value) == (f"cannot edit job #{b}: output {tmp_path}/a.mkv and {tmp_path}/a.mp4, the output of "
                                f"job #{a} (a), which is queued, both write {tmp_path}/a.latents.safetensors (the "
                                f"latents); choose another output name or cancel #{a}")
        assert ledger.get(b).output == str(tmp_path / "b.mp4")
        ledger.update(b, payload={}, output=str(tmp_path / "b.mkv"))     # its own files: free
        assert ledger.get(b).output == str(tmp_path / "b.mkv")


@pytest.mark.parametrize("job_id", [2**63, 10**19 + 7, -2**63 - 1, 10**30])
def test_an_id_beyond_64_bits_names_no_job(ledger, job_id):
    for call in (ledger.get, ledger.cancel, ledger.history, ledger.logs, ledger.retry, ledger.pause, ledger.resume,
                 lambda i: ledger.log(i, "x"), lambda i: ledger.update(i, priority=1)):
        with pytest.raises(InputError, match=f"no job #{job_id}"):
            call(job_id)


def test_one_output_twice_in_one_submission_is_refused(db, tmp_path):
    out = str(tmp_path / "film.mp4")
    Ledger(db).close()
    with refused(db) as (led, e):
        led.submit([spec("a", output=out), spec("b", output=out), spec(output=os.path.relpath(out))])
    msg = str(e.value)
    assert (f"job 1 (b): output {out} is also the output of job 0 (a) of this submission; give each job its own "
            "output path") in msg
    assert f"job 2: output {out} is also the output of job 0 (a)" in msg
    assert Ledger(db).jobs() == []


def test_an_output_of_an_ended_job_is_free(ledger, tmp_path):
    outs = [str(tmp_path / f"{n}.mp4") for n in ("done", "failed", "blocked", "canceled")]
    ids = ledger.submit([spec(output=o) for o in outs])
    ledger.complete(ledger.claim("w").id, "w")
    ledger.fail(ledger.claim("w").id, "w", "bad", "config")
    ledger.fail(ledger.claim("w").id, "w", "flagged", "guard")
    ledger.cancel(ids[3])
    assert [ledger.get(i).state.value for i in ids] == ["succeeded", "failed", "blocked-by-guard", "canceled"]
    assert len(ledger.submit([spec(output=o) for o in outs])) == 4
    with pytest.raises(InputError, match="output must be a non-empty path string or None, got ''"):
        ledger.submit([spec(output="")])


def test_two_concurrent_submits_cannot_both_take_an_output(tmp_path):
    """The check runs in submit's transaction: the second submit waits for the first, then sees its job."""
    path, out = tmp_path / "queue.db", str(tmp_path / "a.mp4")
    Ledger(path).close()
    checking, real = threading.Event(), Ledger._output_clashes

    def slow_check(db, specs):
        found = real(db, specs)
        checking.set()
        time.sleep(0.3)                                     # the other submit starts now
        return found

    results: dict[str, object] = {}

    def submit(who: str, check) -> None:
        with Ledger(path) as led:
            led._output_clashes = check
            try:
                results[who] = led.submit([spec(who, output=out)])
            except InputError as e:
                results[who] = e

    first = threading.Thread(target=submit, args=("first", slow_check))
    first.start()
    assert checking.wait(10)
    submit("second", real)
    first.join()
    assert results["first"] == [1]
    second = results["second"]
    assert isinstance(second, InputError) and "already the output of job #1 (first), which is queued" in str(second)
