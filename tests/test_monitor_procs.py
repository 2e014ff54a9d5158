"""monitor/procs.py with real process trees: a supervisor-like session leader,
a stage leader in its own process group with EAGLE3_RUN_ID set, and workers
that outlive the leader (reparented to init) after staying in its group,
moving to a group of their own, or calling setsid."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

import psutil
import pytest

from eagle3_console.kernel.model import GpuInfo, GpuProcess, GpuReport
from eagle3_console.monitor import procrows
from eagle3_console.monitor.procs import (ProcessTable, RunRef, attach_owners, owner_of,
                                          process_alive, run_processes)
from eagle3_console.kernel.workspace import ENV_RUN_ID, ENV_WORKSPACE

WS = "/ws/test"

# Like supervise.py: stage leader in its own process group with the run id in
# its environment; forwards the leader's report, then lives until stdin closes.
SUPERVISOR = r"""
import os, subprocess, sys
import psutil
env = dict(os.environ, EAGLE3_RUN_ID=sys.argv[1], EAGLE3_WORKSPACE='/ws/test')
leader = subprocess.Popen([sys.executable, '-c', sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]],
                          env=env, process_group=0, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
print(leader.pid, psutil.Process(leader.pid).create_time(), flush=True)
print(leader.stdout.readline().decode().strip(), flush=True)
if sys.argv[4] == 'exit':
    leader.wait()
    print('leader-exited', flush=True)
sys.stdin.read()
"""

# The stage: starts a worker and either exits at once (leaving it orphaned) or stays.
LEADER = r"""
import subprocess, sys, time
w = subprocess.Popen([sys.executable, '-c', sys.argv[3], sys.argv[1]],
                     stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
print(w.stdout.readline().decode().strip(), flush=True)
if sys.argv[2] == 'stay':
    time.sleep(120)
"""

# A GPU-worker stand-in: detaches as told, starts a grandchild, reports pids.
WORKER = r"""
import os, subprocess, sys, time
if sys.argv[1] == 'session':
    os.setpgid(0, 0)
elif sys.argv[1] == 'setsid':
    os.setsid()
g = subprocess.Popen(['sleep', '120'], stdin=subprocess.DEVNULL)
print(os.getpid(), g.pid, flush=True)
time.sleep(120)
"""


class Tree:
    def __init__(self, sup: subprocess.Popen, leader: int, worker: int, grand: int, run_id: int):
        self.sup, self.leader, self.worker, self.grand, self.run_id = sup, leader, worker, grand, run_id

    def ref(self) -> RunRef:
        sup = psutil.Process(self.sup.pid)
        return RunRef(run_id=self.run_id, stage="extract", pid=self.leader, create_time=self.leader_ct,
                      pgid=self.leader, sid=os.getsid(self.sup.pid),
                      supervisor_pid=sup.pid, supervisor_create_time=sup.create_time(), workspace=WS)


@pytest.fixture
def spawned():
    """Processes started by a test; killed afterwards (psutil checks the create time)."""
    procs: list[psutil.Process] = []
    popens: list[subprocess.Popen] = []
    yield procs, popens
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    for p in popens:
        if p.stdin:
            p.stdin.close()
        p.kill()
        p.wait()


def start_tree(spawned, run_id: int, worker_mode: str, leader: str) -> Tree:
    procs, popens = spawned
    sup = subprocess.Popen([sys.executable, "-c", SUPERVISOR, str(run_id), LEADER, worker_mode, leader, WORKER],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    popens.append(sup)
    pid, ct = sup.stdout.readline().split()
    leader_pid, leader_ct = int(pid), float(ct)
    worker_pid, grand_pid = map(int, sup.stdout.readline().split())
    procs.extend(psutil.Process(p) for p in (worker_pid, grand_pid))
    if leader == "stay":
        procs.append(psutil.Process(leader_pid))
    else:
        assert sup.stdout.readline().strip() == b"leader-exited"
    tree = Tree(sup, leader_pid, worker_pid, grand_pid, run_id)
    tree.leader_ct = leader_ct      # as the supervisor recorded it
    return tree


def test_process_alive_trusts_pid_only_with_create_time():
    me = psutil.Process()
    assert process_alive(me.pid, me.create_time())
    assert not process_alive(me.pid, me.create_time() + 1.0)
    assert not process_alive(me.pid, None)
    assert not process_alive(None, me.create_time())
    child = subprocess.Popen(["sleep", "30"])
    ct = psutil.Process(child.pid).create_time()
    assert process_alive(child.pid, ct)
    child.kill()
    # Exited but not yet reaped: a zombie runs nothing.
    deadline = time.monotonic() + 10
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not process_alive(child.pid, ct)
    child.wait()
    assert not process_alive(child.pid, ct)


def test_live_tree_is_tied_by_tree_and_supervisor_is_not(spawned):
    tree = start_tree(spawned, 41, "plain", "stay")
    procs = run_processes(tree.ref())
    hows = {p.pid: p.how for p in procs}
    assert hows == {tree.leader: "leader", tree.worker: "tree", tree.grand: "tree"}
    assert procs[0].pid == tree.leader
    assert all(p.run_id == 41 and p.stage == "extract" for p in procs)
    worker = next(p for p in procs if p.pid == tree.worker)
    assert worker.cmdline[:2] == (sys.executable, "-c")
    assert worker.create_time == pytest.approx(psutil.Process(tree.worker).create_time(), abs=0.01)
    assert tree.sup.pid not in hows
    # Even unrecorded, the supervisor (in the run's session, but older than
    # the leader) is no stage process.
    bare = dataclasses.replace(tree.ref(), supervisor_pid=None, supervisor_create_time=None)
    assert {p.pid for p in run_processes(bare)} == set(hows)


@pytest.mark.parametrize("worker_mode, how", [("plain", "pgid"), ("session", "session"), ("setsid", "env")])
def test_orphan_outliving_its_leader_stays_tied(spawned, worker_mode, how):
    tree = start_tree(spawned, 42, worker_mode, "exit")
    assert not psutil.pid_exists(tree.leader) or psutil.Process(tree.leader).ppid() != tree.sup.pid
    assert psutil.Process(tree.worker).ppid() != tree.leader      # reparented
    ref = tree.ref()
    hows = {p.pid: p.how for p in run_processes(ref)}
    # The grandchild is the orphan's descendant; it is also in the orphan's
    # group/session, which ranks below the tree.
    assert hows == {tree.worker: how, tree.grand: "tree"}
    assert owner_of(tree.worker, [ref]) == (42, "extract", how)


def test_group_ids_of_a_finished_run_do_not_tie_processes_started_after_it_ended(spawned):
    """After pids wrap, a finished run's process group id can name another program's
    group; only processes older than the run's end are tied through it."""
    tree = start_tree(spawned, 47, "plain", "exit")
    ref = tree.ref()
    worker_ct = psutil.Process(tree.worker).create_time()
    ended_after = dataclasses.replace(ref, ended=worker_ct + 0.5)
    assert {p.pid: p.how for p in run_processes(ended_after)}[tree.worker] == "pgid"
    ended_before = dataclasses.replace(ref, ended=worker_ct - 5.0, workspace="/ws/elsewhere")
    assert tree.worker not in {p.pid for p in run_processes(ended_before)}


def test_zombie_leader_is_not_listed_but_its_orphan_is(spawned):
    procs, popens = spawned
    # We are the leader's parent and do not reap it yet: it stays a zombie.
    leader = subprocess.Popen([sys.executable, "-c", LEADER, "plain", "exit", WORKER],
                              stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)
    popens.append(leader)
    ct = psutil.Process(leader.pid).create_time()
    worker, grand = map(int, leader.stdout.readline().split())
    procs.extend(psutil.Process(p) for p in (worker, grand))
    deadline = time.monotonic() + 30
    while psutil.Process(leader.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.01)
    assert psutil.Process(leader.pid).status() == psutil.STATUS_ZOMBIE
    ref = RunRef(run_id=46, stage="extract", pid=leader.pid, create_time=ct, pgid=leader.pid, sid=leader.pid)
    assert not process_alive(leader.pid, ct)
    assert {p.pid: p.how for p in run_processes(ref)} == {worker: "pgid", grand: "tree"}


def test_unrelated_processes_are_not_tied(spawned):
    procs, popens = spawned
    tree = start_tree(spawned, 43, "setsid", "exit")
    plain = subprocess.Popen(["sleep", "60"])
    other_run = subprocess.Popen(["sleep", "60"], start_new_session=True,
                                 env=dict(os.environ, **{ENV_RUN_ID: "430", ENV_WORKSPACE: WS}))
    # Same run id, another workspace: run ids repeat across workspaces.
    other_ws = subprocess.Popen(["sleep", "60"], start_new_session=True,
                                env=dict(os.environ, **{ENV_RUN_ID: "43", ENV_WORKSPACE: "/ws/other"}))
    popens.extend([plain, other_run, other_ws])
    ref = tree.ref()
    table = ProcessTable.snapshot()
    tied = {p.pid for p in run_processes(ref, table)}
    assert tied == {tree.worker, tree.grand}
    for pid in (plain.pid, other_run.pid, other_ws.pid, os.getpid(), tree.sup.pid, 1):
        assert owner_of(pid, [ref], table) is None
    # With both runs known, each process goes to its own run.
    ref430 = RunRef(run_id=430, stage="train", pid=None, create_time=None, workspace=WS)
    assert owner_of(other_run.pid, [ref, ref430], table) == (430, "train", "env")
    assert owner_of(tree.worker, [ref, ref430], table) == (43, "extract", "env")


def test_reused_pid_is_not_trusted(spawned):
    procs, popens = spawned
    # A process that happens to hold the recorded pid, group and session ids
    # (what pid reuse looks like): a wrong create_time must make all of them void.
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    popens.append(stranger)
    ct = psutil.Process(stranger.pid).create_time()
    ref = RunRef(run_id=44, stage="extract", pid=stranger.pid, create_time=ct - 5.0,
                 pgid=stranger.pid, sid=stranger.pid)
    assert run_processes(ref) == []
    ok = RunRef(run_id=44, stage="extract", pid=stranger.pid, create_time=ct,
                pgid=stranger.pid, sid=stranger.pid)
    assert [(p.pid, p.how) for p in run_processes(ok)] == [(stranger.pid, "leader")]


def test_attach_owners_fills_gpu_processes(spawned):
    procs, popens = spawned
    tree = start_tree(spawned, 45, "plain", "exit")
    plain = subprocess.Popen(["sleep", "60"])
    popens.append(plain)
    gone = subprocess.Popen(["true"])
    gone.wait()
    report = GpuReport(available=True, gpus=[
        GpuInfo(index=0, processes=[GpuProcess(pid=tree.worker, used_bytes=2 << 30),
                                    GpuProcess(pid=plain.pid, used_bytes=1 << 20)]),
        GpuInfo(index=1, processes=[GpuProcess(pid=tree.grand, used_bytes=None),
                                    GpuProcess(pid=gone.pid, used_bytes=5)]),
    ])
    attach_owners(report, [tree.ref()])
    w, p = report.gpus[0].processes
    g, x = report.gpus[1].processes
    assert (w.run_id, w.stage, w.how) == (45, "extract", "pgid")
    assert w.name == "python3" or w.name.startswith("python")
    assert w.create_time == pytest.approx(psutil.Process(tree.worker).create_time(), abs=0.01)
    assert (g.run_id, g.how, g.name) == (45, "tree", "sleep")
    assert (p.run_id, p.stage, p.how, p.name) == (None, None, None, "sleep")
    assert (x.run_id, x.create_time) == (None, None)


def test_run_ref_from_registry_row():
    class Row:
        id, stage, pid, create_time, pgid, sid = 7, "train", 123, 1.5, 123, 100
        supervisor_pid, supervisor_create_time, cwd, ended = 99, 1.0, "/ws", None
    ref = RunRef.from_run(Row())
    assert ref == RunRef(7, "train", 123, 1.5, 123, 100, 99, 1.0, "/ws", None)


@pytest.mark.parametrize("worker_mode", ["plain", "session", "setsid"])
def test_owners_of_given_pids_agree_with_the_full_answer_and_read_few_environments(spawned, worker_mode):
    """attach_owners asks only about the GPU processes: the same tie as the full
    answer (leader, tree, group, session, environment and the tree below it),
    reading the environments of those pids and their ancestors only. Before,
    every process of the machine newer than the oldest run had its
    environment read by each one-shot `status`."""
    from eagle3_console.monitor import procrows
    stay = start_tree(spawned, 46, worker_mode, "stay")
    orphaned = start_tree(spawned, 47, worker_mode, "exit")
    bystanders = [subprocess.Popen(["sleep", "60"]) for _ in range(5)]
    spawned[1].extend(bystanders)
    refs = (stay.ref(), orphaned.ref())
    full = ProcessTable.snapshot().owners(refs)
    asked = {stay.leader, stay.worker, stay.grand, orphaned.worker, orphaned.grand, bystanders[0].pid}
    procrows._ENV_CACHE.clear()
    table = ProcessTable.snapshot()
    some = table.owners(refs, only=asked)
    assert set(some) == asked & set(full) and len(some) == 5
    for pid, info in some.items():
        assert (info.run_id, info.how, info.cmdline) == (full[pid].run_id, full[pid].how, full[pid].cmdline)
    look = set(asked)
    for pid in asked:
        look.update(table.ancestors(pid))
    assert {pid for pid, _ct in procrows._ENV_CACHE} <= look
    assert not any(b.pid in {pid for pid, _ct in procrows._ENV_CACHE} for b in bystanders[1:])


def _answer(owners: dict) -> dict:
    # Two tables are two readings: a process just started may be running in one
    # and sleeping in the other; every other field must agree.
    return {pid: dataclasses.replace(info, status="") for pid, info in owners.items()}


def _chain(pid: int) -> set[int]:
    """pid and its ancestors as psutil walks them, up to (not including) init."""
    out = set()
    try:
        p = psutil.Process(pid)
        while True:
            out.add(p.pid)
            if p.ppid() <= 1:
                return out
            p = psutil.Process(p.ppid())
    except psutil.NoSuchProcess:
        return out


def test_partial_table_gives_the_full_tables_answer_for_its_pids(spawned):
    """Leader with child and grandchild, orphans tied by group, session and
    environment (a worker that called setsid), an unrelated process, one with
    another run's environment, init, a dead pid: for every pid set the partial
    table names the same owners, the same way, as the whole machine's table."""
    procs_, popens = spawned
    stay = start_tree(spawned, 50, "plain", "stay")
    by_group = start_tree(spawned, 51, "plain", "exit")
    by_session = start_tree(spawned, 52, "session", "exit")
    by_env = start_tree(spawned, 53, "setsid", "exit")
    assert psutil.Process(by_group.worker).ppid() != by_group.leader    # reparented, still in the group
    unrelated = subprocess.Popen(["sleep", "60"])
    other_run = subprocess.Popen(["sleep", "60"], start_new_session=True,
                                 env=dict(os.environ, **{ENV_RUN_ID: "530", ENV_WORKSPACE: WS}))
    popens.extend([unrelated, other_run])
    gone = subprocess.Popen(["true"])
    gone.wait()
    trees = (stay, by_group, by_session, by_env)
    refs = tuple(t.ref() for t in trees)
    members = {p for t in trees for p in (t.leader, t.worker, t.grand)}
    pid_sets = [
        *({t.leader, t.worker, t.grand} for t in trees),
        *({t.grand} for t in trees),                     # tied through an ancestor only
        {t.sup.pid for t in trees},                      # supervisors: never stage processes
        {unrelated.pid, other_run.pid, gone.pid, 1},     # nobody's, a dead pid, init
        members | {unrelated.pid, other_run.pid, gone.pid, 1, os.getpid()},
    ]
    expected_hows = {stay.leader: "leader", stay.worker: "tree", stay.grand: "tree",
                     by_group.worker: "pgid", by_group.grand: "tree",
                     by_session.worker: "session", by_session.grand: "tree",
                     by_env.worker: "env", by_env.grand: "tree"}
    for pids in pid_sets:
        procrows._ENV_CACHE.clear()
        part = ProcessTable.partial(pids, refs).owners(refs, only=pids)
        full = ProcessTable.snapshot().owners(refs, only=pids)
        assert _answer(part) == _answer(full), pids
        assert {p: i.how for p, i in part.items()} == {p: h for p, h in expected_hows.items() if p in pids}
    # The run of a wrongly named environment is still told apart.
    ref530 = RunRef(run_id=530, stage="train", pid=None, create_time=None, workspace=WS)
    pids = {other_run.pid, by_env.worker}
    part = ProcessTable.partial(pids, refs + (ref530,)).owners(refs + (ref530,), only=pids)
    assert _answer(part) == _answer(ProcessTable.snapshot().owners(refs + (ref530,), only=pids))
    assert {p: (i.run_id, i.how) for p, i in part.items()} == {other_run.pid: (530, "env"), by_env.worker: (53, "env")}


def test_partial_table_reads_only_the_pids_their_ancestors_and_the_runs_ids(spawned):
    procs_, popens = spawned
    tree = start_tree(spawned, 54, "plain", "exit")
    bystanders = [subprocess.Popen(["sleep", "60"]) for _ in range(20)]
    popens.extend(bystanders)
    ref = tree.ref()
    part = ProcessTable.partial([tree.grand], [ref])
    full = ProcessTable.snapshot()
    # The leader has exited: its pid (and group id) reads nothing.
    want = _chain(tree.grand) | _chain(tree.sup.pid) | _chain(ref.sid) | _chain(ref.pid)
    assert set(part.rows) == want
    assert len(full.rows) >= len(want) + len(bystanders)
    assert not any(b.pid in part.rows for b in bystanders)
    assert [r.pid for r in part.rows.values()] == sorted(part.rows)    # process_iter's order
    for pid, row in part.rows.items():     # read as process_iter reads them (status aside: two instants)
        assert dataclasses.replace(row, status="") == dataclasses.replace(full.rows[pid], status="")


def test_reused_group_id_holder_is_loaded_and_refuses_the_tie_in_both_tables(spawned):
    """The run's group id now names an unrelated program's group: its holder
    (newer than the run) is alive, and a member of that group that is no
    descendant of the holder must not be tied. Without the holder's row the
    id would look still reserved, hence trusted."""
    procs_, popens = spawned
    old_leader = subprocess.Popen(["true"])
    old_leader.wait()
    time.sleep(0.05)
    # A shell in a session of its own, which leaves a sleep in its group
    # reparented away from it, then becomes a sleep itself.
    stranger = subprocess.Popen(["sh", "-c", "(sleep 60 & echo $!); exec sleep 60"], stdout=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    popens.append(stranger)
    member = int(stranger.stdout.readline())
    procs_.append(psutil.Process(member))
    # Reparented away means no ancestor is the shell: the subshell that forked
    # the sleep (the shell's child) must have exited too, which under load
    # comes a while after `echo $!` (its ppid was never the shell's own). _chain, not
    # psutil's parents(), which raises NoSuchProcess when the subshell exits mid-walk.
    wait_for_ppid = time.monotonic() + 10
    while stranger.pid in _chain(member) and time.monotonic() < wait_for_ppid:
        time.sleep(0.01)
    assert stranger.pid not in _chain(member) and os.getpgid(member) == stranger.pid
    holder_ct = psutil.Process(stranger.pid).create_time()
    ref = RunRef(run_id=55, stage="extract", pid=old_leader.pid, create_time=holder_ct - 5.0,
                 pgid=stranger.pid, sid=stranger.pid, workspace=WS)
    part_table = ProcessTable.partial([member], [ref])
    assert part_table.get(stranger.pid) is not None and stranger.pid not in _chain(member)
    assert part_table.owners([ref], only=[member]) == {}
    assert ProcessTable.snapshot().owners([ref], only=[member]) == {}
    # The holder's row is what refuses it: without it the id reads as reserved.
    forgetful = ProcessTable(r for r in part_table.rows.values() if r.pid != stranger.pid)
    assert forgetful.owners([ref], only=[member])[member].how == "pgid"
    # And a run that did start that group ties its member the same in both tables.
    real = dataclasses.replace(ref, create_time=holder_ct)
    part = ProcessTable.partial([member], [real]).owners([real], only=[member])
    assert _answer(part) == _answer(ProcessTable.snapshot().owners([real], only=[member]))
    assert part[member].how == "pgid"


def test_partial_table_prunes_cached_environments_only_of_processes_it_read(spawned, monkeypatch):
    # The pruning is the subject: the processes here are seconds old, cached all the same.
    monkeypatch.setattr(procrows, "ENV_SETTLE_S", 0.0)
    procs_, popens = spawned
    tree = start_tree(spawned, 56, "setsid", "exit")
    bystander = subprocess.Popen(["sleep", "60"])
    popens.append(bystander)
    gone = subprocess.Popen(["true"])
    gone.wait()
    ref = tree.ref()
    procrows._ENV_CACHE.clear()
    worker_ct = psutil.Process(tree.worker).create_time()
    bystander_ct = psutil.Process(bystander.pid).create_time()
    procrows._ENV_CACHE.update({(bystander.pid, bystander_ct): None,     # alive, not read: kept
                                 (2**22 + 7, 1.0): None,                    # gone, not read: kept
                                 (tree.worker, worker_ct - 100.0): None,    # the pid's earlier process
                                 (gone.pid, 1.0): None})                    # read and gone
    table = ProcessTable.partial([tree.worker, gone.pid], [ref])
    assert table.owners([ref], only=[tree.worker])[tree.worker].how == "env"
    assert set(procrows._ENV_CACHE) == {(bystander.pid, bystander_ct), (2**22 + 7, 1.0),
                                         (tree.worker, table.get(tree.worker).create_time)}
    ProcessTable.snapshot()
    assert (2**22 + 7, 1.0) not in procrows._ENV_CACHE and (bystander.pid, bystander_ct) in procrows._ENV_CACHE


WORKER_STAGE = ("import subprocess, sys, time; "
                "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)")


def _collector(ws, gpu_pids: dict[int, int]):
    from eagle3_console.monitor.gpus import Nvml
    from eagle3_console.observe.snapshot import Collector
    from eagle3_console.kernel.workspace import Workspace
    from tests.fake_pynvml import FakeGpu, FakeNvml
    return Collector(Workspace.at(ws.root), nvml=Nvml(module=FakeNvml(gpus=[FakeGpu(compute=gpu_pids)])))


def _live_worker(ws):
    import json
    ws.write(f"[stages.gpuwork]\nargv = [\"python\", \"-c\", {json.dumps(WORKER_STAGE)}]\n")
    ws.cli("run", "gpuwork", check=0)
    run = ws.wait_status("gpuwork", ("running",))
    deadline = time.monotonic() + 20
    while not psutil.Process(run.pid).children() and time.monotonic() < deadline:
        time.sleep(0.05)
    [worker] = psutil.Process(run.pid).children()
    return run, worker.pid


def test_collector_names_gpu_owners_without_walking_the_process_table(ws, monkeypatch):
    """`status --json` with a GPU worker of a live run: the owner comes from a
    partial table; the whole machine's is never built."""
    run, worker = _live_worker(ws)
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        def walk():
            raise AssertionError("the whole process table was walked")
        monkeypatch.setattr(ProcessTable, "snapshot", classmethod(lambda cls: walk()))
        snap = _collector(ws, {worker: 10 << 30, stranger.pid: 1 << 30}).collect()
        procs = {p.pid: p for g in snap.gpus.gpus for p in g.processes}
        assert (procs[worker].run_id, procs[worker].stage, procs[worker].how) == (run.id, "gpuwork", "tree")
        assert procs[worker].visible and procs[worker].create_time is not None
        assert (procs[stranger.pid].run_id, procs[stranger.pid].name) == (None, "sleep")
    finally:
        stranger.kill()
        stranger.wait()
        ws.cli("stop", "gpuwork", "--grace", "1")


def test_collector_walks_once_when_the_leftover_check_needs_the_whole_table(ws, monkeypatch):
    """A failed latest run makes the leftover check walk every process: the GPU
    owners reuse that walk (one walk, no partial table besides)."""
    run, worker = _live_worker(ws)
    ws.write(ws.root.joinpath("eagle3.toml").read_text() + '[stages.other]\nargv = ["true"]\n')
    failed = ws.record_finished_run("other", {}, status="failed", ended_ago_s=3600)
    gone = subprocess.Popen(["true"])
    gone.wait()
    with ws.registry() as reg:      # the check looks only at runs that had a process
        reg.update(failed.id, pid=gone.pid, create_time=time.time() - 3700)
    real = ProcessTable.snapshot.__func__
    walks = []

    def counted(cls):
        walks.append(1)
        return real(cls)
    monkeypatch.setattr(ProcessTable, "snapshot", classmethod(counted))
    monkeypatch.setattr(ProcessTable, "partial", classmethod(lambda cls, *a: pytest.fail("partial table read")))
    try:
        snap = _collector(ws, {worker: 10 << 30}).collect()
        [gp] = [p for g in snap.gpus.gpus for p in g.processes]
        assert (gp.run_id, gp.how) == (run.id, "tree") and walks == [1]
    finally:
        ws.cli("stop", "gpuwork", "--grace", "1")


def test_a_process_read_before_its_exec_is_tied_by_the_environment_it_execs_with():
    """A launch with its own environment forks, then execs: /proc shows the parent's environment
    until the exec, which keeps the pid and the create time. A look in between (another monitor's
    snapshot, a loaded machine) must not hide the run's id for the process's life: test_faults'
    env-tie test failed so once, its child found nobody's."""
    program = ("import os, sys; print('forked', flush=True); sys.stdin.readline(); "
               "os.execve(sys.executable, [sys.executable, '-c', "
               "\"import time; print('exec', flush=True); time.sleep(60)\"], "
               f"dict(os.environ, {ENV_RUN_ID}='78', {ENV_WORKSPACE}='{WS}'))")
    env = {k: v for k, v in os.environ.items() if k not in (ENV_RUN_ID, ENV_WORKSPACE)}
    child = subprocess.Popen([sys.executable, "-c", program], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert child.stdout.readline() == "forked\n"
        ct = psutil.Process(child.pid).create_time()
        ref = RunRef(run_id=78, stage="train", pid=None, create_time=ct - 5.0, workspace=WS)
        assert child.pid not in ProcessTable.snapshot().owners((ref,))      # the parent's environment
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "exec\n"
        assert psutil.Process(child.pid).create_time() == ct                 # the same process
        assert ProcessTable.snapshot().owners((ref,))[child.pid].how == "env"
    finally:
        child.kill()
        child.wait()
