"""A real SLURM cluster on localhost for the tests: munged, slurmctld and slurmd started in the background.

It installs nothing (CI's ``.ci/run`` installs ``slurm-wlm`` and ``munge`` with apt). Everything it writes lives
under one folder: its own munge key and socket, ``slurm.conf``, state, spool, logs and pid files; daemons are
started directly (so their pids are known) and stopped by those pids. Free ports and a random first job id keep
two clusters on one machine (concurrent test sessions) apart.

Nodes: ``localhost`` (partition ``debug``, the default) and, for multi-node tests, ``node1`` and ``node2``
(partition ``two``), each its own ``slurmd`` on its own port. A job's ``MASTER_ADDR`` is its first node's name,
so ``node1``/``node2`` must resolve to 127.0.0.1 (``.ci/run`` adds them to ``/etc/hosts``).

Run by hand: ``python tests/slurm/cluster.py`` starts one, prints the ``SLURM_CONF`` to export, and stops it on
Ctrl-C.
"""
from __future__ import annotations

import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "scontrol", "squeue", "scancel", "sinfo")
SBIN = ("/usr/sbin", "/sbin", "/usr/local/sbin")
# node1/node2 come first: while "localhost" is the only node defined, slurm resolves any name to it.
NODES = {"node1": "two", "node2": "two", "localhost": "debug"}
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


class ClusterUnavailable(RuntimeError):
    """SLURM cannot run here (not installed, not root, or the daemons did not come up); the message says why."""


def _which(name: str) -> Optional[str]:
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN))


def missing_reason() -> Optional[str]:
    """Why a cluster cannot be started on this machine, or ``None`` when it can be tried."""
    missing = [name for name in DAEMONS + CLIENTS if _which(name) is None]
    if missing:
        return (f"slurm-wlm/munge are not installed (missing {', '.join(missing)}); "
                "install them with `apt-get install -y slurm-wlm munge` (CI's .ci/run does)")
    if os.geteuid() != 0:
        return "starting slurmd and munged needs root (they switch users and launch jobs)"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "the 'munge' user does not exist (the munge package creates it)"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def hosts_resolve(names: tuple[str, ...] = ("node1", "node2")) -> bool:
    """True when every name resolves to 127.0.0.1 (needed by jobs on the emulated nodes)."""
    try:
        return all(socket.gethostbyname(name) == "127.0.0.1" for name in names)
    except OSError:
        return False


class SlurmCluster:
    """One controller and three ``slurmd`` (localhost, node1, node2) under ``root``; see the module docstring."""

    def __init__(self, root: Optional[Path] = None, cpus: int = 2) -> None:
        self.root = Path(root or tempfile.mkdtemp(prefix="slurm-"))
        self.cpus = cpus
        self.conf = self.root / "slurm.conf"
        self.munge_dir = self.root / "munge"
        self.socket = self.munge_dir / "munge.socket"
        self._procs: list[tuple[str, subprocess.Popen]] = []

    # ------------------------------------------------------------------ environment for clients and jobs
    @property
    def env(self) -> dict[str, str]:
        """``os.environ`` plus ``SLURM_CONF`` and the sbin folders on PATH: what clients and jobs need."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        path = env.get("PATH", "")
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), path, *SBIN])
        for key in [k for k in env if k.startswith("SLURM_") and k != "SLURM_CONF"]:
            del env[key]  # a test run inside a SLURM job must not leak its job's variables
        return env

    def command(self, *args: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
        """Run a SLURM client (``sbatch``, ``scontrol``, ...) against this cluster; output as text."""
        result = subprocess.run([_which(args[0]) or args[0], *args[1:]], env=self.env, capture_output=True,
                                text=True, timeout=timeout)  # fmt: skip
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    # ------------------------------------------------------------------ start / stop
    def start(self, timeout: float = 60) -> "SlurmCluster":
        """Write the configuration, start the daemons and wait until every node is idle."""
        reason = missing_reason()
        if reason:
            raise ClusterUnavailable(reason)
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)  # munged runs as 'munge' and must reach its folder
        try:
            self._start_munge()
            self._write_conf()
            for sub in ("state", "spool", "log"):
                (self.root / sub).mkdir(exist_ok=True)
            self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            for node in NODES:
                self._spawn(f"slurmd-{node}", [_which("slurmd"), "-D", "-f", str(self.conf), "-N", node])
            self._wait_idle(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_munge(self) -> None:
        munge = pwd.getpwnam("munge")
        self.munge_dir.mkdir(exist_ok=True)
        os.chown(self.munge_dir, munge.pw_uid, munge.pw_gid)
        os.chmod(self.munge_dir, 0o711)  # clients need to reach the socket
        key = self.munge_dir / "munge.key"
        subprocess.run([_which("mungekey"), "--create", "--force", f"--keyfile={key}"], check=True,
                       capture_output=True, timeout=30)  # fmt: skip
        os.chown(key, munge.pw_uid, munge.pw_gid)
        os.chmod(key, 0o600)
        self._spawn("munged", [_which("munged"), "--foreground", "--force", f"--socket={self.socket}",
                               f"--key-file={key}", f"--pid-file={self.munge_dir / 'munged.pid'}",
                               f"--log-file={self.munge_dir / 'munged.log'}",
                               f"--seed-file={self.munge_dir / 'munged.seed'}"],
                    user=munge.pw_uid, group=munge.pw_gid)  # fmt: skip
        deadline = time.monotonic() + 15
        while not self.socket.exists():
            self._check_alive()
            if time.monotonic() > deadline:
                raise ClusterUnavailable(f"munged did not create {self.socket}: {self._log_tail('munged')}")
            time.sleep(0.1)

    def _write_conf(self) -> None:
        root = self.root
        lines = [
            "ClusterName=trainertest",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire: a requeued job waits this long before it may start again (default 120 s).
            f"AuthInfo=socket={self.socket},cred_expire=10",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "JobRequeue=1",
            "ReturnToService=2",
            # Trust the configured CPUs/memory: node1 and node2 share this machine's cores.
            "SlurmdParameters=config_overrides",
            "SchedulerType=sched/backfill",
            # A requeued job waits for its BeginTime; the default loops (60 s main, 30 s backfill) would add that much.
            "SchedulerParameters=sched_interval=2,bf_interval=1",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "KillWait=5",
            "MinJobAge=600",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "MessageTimeout=20",
            # Distinct job ids per cluster: jobs derive their rendezvous port from the id.
            f"FirstJobId={random.randint(1000, 900000)}",
            f"StateSaveLocation={root / 'state'}",
            f"SlurmdSpoolDir={root / 'spool' / '%n'}",
            f"SlurmctldPidFile={root / 'slurmctld.pid'}",
            f"SlurmdPidFile={root / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={root / 'log' / 'slurmd-%n.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
        ]
        for node in NODES:
            lines.append(f"NodeName={node} NodeAddr=127.0.0.1 Port={_free_port()} CPUs={self.cpus} "
                         "RealMemory=4000 State=UNKNOWN")  # fmt: skip
        for partition in dict.fromkeys(NODES.values()):
            members = ",".join(n for n, p in NODES.items() if p == partition)
            default = "YES" if partition == "debug" else "NO"
            lines.append(f"PartitionName={partition} Nodes={members} Default={default} MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")

    def _spawn(self, name: str, argv: list[str], **kwargs) -> None:
        log = open(self.root / f"{name}.out", "wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=self.env, start_new_session=True, **kwargs)  # fmt: skip
        log.close()
        self._procs.append((name, proc))

    def _check_alive(self) -> None:
        for name, proc in self._procs:
            if proc.poll() is not None:
                raise ClusterUnavailable(f"{name} exited with status {proc.returncode}: {self._log_tail(name)}")

    def _log_tail(self, name: str, lines: int = 15) -> str:
        texts = []
        for path in (self.root / f"{name}.out", self.root / "log" / f"{name}.log", self.munge_dir / f"{name}.log"):
            if path.exists():
                texts.append("\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(texts) or "(no output)"

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        states = ""
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                result = self.command("sinfo", "-h", "-N", "-o", "%N %t", check=False, timeout=5)
            except subprocess.TimeoutExpired:
                continue
            states = result.stdout.strip()
            seen = dict(line.split() for line in states.splitlines() if len(line.split()) == 2)
            if set(seen) >= set(NODES) and all(seen[n] == "idle" for n in NODES):
                return
            time.sleep(0.5)
        raise ClusterUnavailable(f"SLURM nodes did not become idle within {timeout:.0f}s (sinfo: {states!r}); "
                                 f"slurmctld log:\n{self._log_tail('slurmctld')}")  # fmt: skip

    def stop(self) -> None:
        """Cancel every job, then stop the daemons by pid (SIGTERM, SIGKILL after 10 s). Safe to call twice."""
        if any(name == "slurmctld" and proc.poll() is None for name, proc in self._procs):
            self.command("scancel", "--full", "--user", str(os.geteuid()), check=False, timeout=15)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                result = self.command("squeue", "-h", "-o", "%i", check=False, timeout=15)
                if result.returncode != 0 or not result.stdout.strip():
                    break
                time.sleep(0.5)
        for name, proc in reversed(self._procs):  # slurmd before slurmctld before munged
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        self._procs = []

    # ------------------------------------------------------------------ jobs
    def submit(self, script: Path, *args: str, cwd: Optional[Path] = None, env: Optional[dict[str, str]] = None) -> int:
        """``sbatch --parsable script`` (the job inherits ``env``, default :attr:`env`); returns the job id."""
        result = subprocess.run([_which("sbatch"), "--parsable", *args, str(script)], env=env or self.env, cwd=cwd,
                                capture_output=True, text=True, timeout=30)  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"sbatch failed: {result.stderr.strip()}")
        return int(result.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, Restarts, ExitCode, ...)."""
        text = self.command("scontrol", "show", "job", "-o", str(job_id)).stdout
        fields = {}
        for item in text.split():
            key, _, value = item.partition("=")
            fields[key] = value
        return fields

    def wait(self, job_id: int, timeout: float, states: tuple[str, ...] = FINAL_STATES) -> dict[str, str]:
        """Wait until the job is in one of ``states``; raise ``TimeoutError`` (with its state) after ``timeout``."""
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            time.sleep(0.5)
        self.command("scancel", str(job_id), check=False)
        raise TimeoutError(f"job {job_id} not in {states} after {timeout:.0f}s: JobState={info.get('JobState')} "
                           f"Reason={info.get('Reason')}")  # fmt: skip


def main() -> None:
    """Start a cluster, print how to use it, stop it on Ctrl-C or SIGTERM."""
    cluster = SlurmCluster()
    try:
        cluster.start()
    except ClusterUnavailable as err:
        sys.exit(f"cannot start SLURM: {err}")
    print(f"SLURM is up under {cluster.root}\n  export SLURM_CONF={cluster.conf}\nCtrl-C stops it.", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            time.sleep(3600)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
