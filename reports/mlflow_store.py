"""The MLflow store the sweeps and the diagnostics log to and the reports read: where it is, opening it
safely, experiments.

`resolve_tracking_uri` picks the store (`--tracking-uri`, $MLFLOW_TRACKING_URI, else ./mlflow.db);
`client(uri)` opens it once it is usable (`prepare_store`: a new sqlite file is created and migrated
by one process while the others wait; an http(s) server or a database must answer within seconds);
`database_url` names the PostgreSQL driver of a `postgresql://` URL (the MLflow store's and the Optuna
storage's); `ensure_experiment` finds or makes `ready-<name>`; `flatten` turns a config into MLflow
params; `retry` rides out a busy sqlite file. What a sweep logs inside its experiments is
`sweeps.tracking`'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, TypeVar

from omegaconf import DictConfig, OmegaConf

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
T = TypeVar("T")


def experiment_name(name: str) -> str:
    """The MLflow experiment of a sweep (or a diagnostic) called `name`: `ready-<name>`."""
    return f"ready-{name}"


def resolve_tracking_uri(uri: Optional[str] = None) -> str:
    """`--tracking-uri`, else $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working directory.

    A relative sqlite path is made absolute so worker processes started elsewhere use the same file; a
    PostgreSQL URL names the driver this project installs (`database_url`).
    """
    uri = database_url(uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI)
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix):].startswith("/"):
        uri = prefix + str(Path(uri[len(prefix):]).resolve())
    return uri


def retry(fn: Callable[[], T], attempts: int = 8) -> T:
    """Retry an MLflow call that failed on a busy sqlite file (several workers write to one file)."""
    for i in range(attempts):
        try:
            return fn()
        except Exception as e:  # mlflow wraps sqlite's OperationalError in MlflowException
            if "locked" not in str(e).lower() or i == attempts - 1:
                raise
            time.sleep(0.2 * (2 ** i))
    raise AssertionError("unreachable")


class TrackingError(ValueError):
    """The tracking URI cannot be used (server unreachable, file not an MLflow store); one line says why."""


PROBE_TIMEOUT_S = 5.0  # how long an http(s) tracking server gets to answer before the caller gives up
_prepared: set[str] = set()  # tracking URIs this process has checked (and created, for sqlite)


def _sqlite_file(uri: str) -> Optional[Path]:
    prefix = "sqlite:///"
    return Path(uri[len(prefix):]) if uri.startswith(prefix) and uri != "sqlite:///:memory:" else None


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock (fcntl.flock) on `path`, held for the block; waits for other holders."""
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _unreachable(reason: Any, timeout: float) -> str:
    """Why a server did not answer, as it happened: refused at once, silent for `timeout` s, or else."""
    if isinstance(reason, ConnectionRefusedError):
        return f"the connection was refused ({reason.strerror or reason}: nothing listens at that address)"
    if isinstance(reason, TimeoutError) or str(reason) == "timed out":
        return f"no answer within {timeout:g} s ({reason})"
    return f"cannot reach it ({reason})"


def check_server(uri: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Raise TrackingError unless an MLflow server answers at an http(s) URI within `timeout`
    seconds (MLflow itself would retry for minutes without a word): `/health` says OK, or the
    REST API answers (or asks for credentials). A gateway's 404 or 502 is not a tracking server."""
    import urllib.error
    import urllib.request

    root = uri.rstrip("/")
    status = None
    for path in ("/health", "/api/2.0/mlflow/experiments/search?max_results=1"):
        try:
            with urllib.request.urlopen(root + path, timeout=timeout) as r:
                status = r.status
        except urllib.error.HTTPError as e:
            status = e.code
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise TrackingError(f"tracking URI {uri!r}: {_unreachable(getattr(e, 'reason', None) or e, timeout)}; "
                                "expected a reachable MLflow server (`mlflow server ...`) or a sqlite:/// path") from None
        if status in (200, 401, 403):
            return
    raise TrackingError(f"tracking URI {uri!r}: the server there answers HTTP {status} to MLflow's API; "
                        "expected an MLflow tracking server (`mlflow server ...`)")


# ---------------------------------------------------------------------------------------------
# Database URLs (an MLflow store in PostgreSQL; the Optuna storage of sweeps on several hosts)

DATABASE_DIALECTS = ("postgresql", "postgres", "mysql", "mssql")  # SQLAlchemy URLs, `dialect[+driver]://...`
TRACKING_SCHEMES = ("sqlite", "http", "https", "databricks", *DATABASE_DIALECTS)
TRACKING_EXPECTED = ("expected sqlite:///PATH (e.g. sqlite:///mlflow.db), http(s)://HOST:PORT (an MLflow server) or "
                     "postgresql://USER@HOST:5432/DB")


def dialect(url: str) -> str:
    """`postgresql` for postgresql+psycopg2://..., '' for a string without `://`."""
    return url.split("://", 1)[0].split("+", 1)[0].lower() if "://" in url else ""


def is_database_url(url: str) -> bool:
    return dialect(url) in DATABASE_DIALECTS


def database_url(url: str) -> str:
    """A PostgreSQL URL as the docs and messages write it (`postgresql://...`, or `postgres://...`) with the
    driver this project installs named: `postgresql+psycopg2://...`. SQLAlchemy 2.1 picks psycopg 3 for a bare
    `postgresql://`, which is not installed; naming psycopg2 works with every SQLAlchemy. Both the Optuna
    storage (`--storage`) and the MLflow store (`--tracking-uri`) go through here; other URLs are unchanged."""
    for bare in ("postgresql://", "postgres://"):
        if url.startswith(bare):
            return "postgresql+psycopg2://" + url[len(bare):]
    return url


def redact(url: str) -> str:
    """`url` with its password hidden, for messages and logs."""
    if "://" not in url or "@" not in url:
        return url
    scheme, rest = url.split("://", 1)
    credentials, _, host = rest.rpartition("@")
    user, colon, _ = credentials.partition(":")
    return f"{scheme}://{user}{':***' if colon else ''}@{host}"


def database_problem(url: str, timeout: float = PROBE_TIMEOUT_S) -> Optional[str]:
    """Why the database at `url` cannot be used, in one line, or None when it answers: one connection with
    a `timeout`-second connect timeout and no retries, so an unreachable or refusing server is said within
    seconds (MLflow retries its first connection for about 100 s without a word)."""
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    connect_args = {"connect_timeout": max(2, int(timeout))} if dialect(url) in ("postgresql", "postgres", "mysql") else {}
    try:
        engine = sqlalchemy.create_engine(database_url(url), poolclass=NullPool, connect_args=connect_args)
    except ModuleNotFoundError as e:
        return f"its driver is not installed ({e})"
    except Exception as e:  # a malformed URL
        return f"not a database URL ({_first_line(e)})"
    try:
        with engine.connect():
            return None
    except Exception as e:
        return f"cannot connect ({_first_line(getattr(e, 'orig', None) or e)})"
    finally:
        engine.dispose()


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0].strip() if text else type(e).__name__)[:300]


def uri_problem(uri: str) -> Optional[str]:
    """Why `uri` names no MLflow store this project opens (a typo in its scheme, a path without one), or None."""
    if uri == "databricks":  # MLflow's name for a Databricks workspace's store (its default profile)
        return None
    if "://" not in uri:
        return f"not a URI (no scheme); {TRACKING_EXPECTED}"
    scheme = uri.split("://", 1)[0].lower()
    if dialect(uri) not in TRACKING_SCHEMES:
        return f"unknown scheme {scheme!r}; {TRACKING_EXPECTED}"
    if scheme == "sqlite" and not uri.startswith("sqlite:///"):
        return f"a sqlite URI takes three slashes before a relative path and four before an absolute one; {TRACKING_EXPECTED}"
    return None


def check_uri(uri: str) -> None:
    """Raise TrackingError (one line) unless `uri` names a store that can be reached: a known scheme, and an
    http(s) server or a database that answers within PROBE_TIMEOUT_S. Reads nothing and writes nothing."""
    problem = uri_problem(uri)
    if problem is None and uri.startswith(("http://", "https://")):
        check_server(uri)
    elif problem is None and is_database_url(uri):
        problem = database_problem(uri)
        if problem:
            problem += "; expected a reachable database (postgresql://USER:PW@HOST:5432/DB) or a sqlite:/// path"
    if problem:
        raise TrackingError(f"tracking URI {redact(uri)!r}: {problem}")


def mlflow_revisions() -> set[str]:
    """The schema revisions this MLflow knows (its migration scripts' `revision = "..."`)."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("mlflow.store.db_migrations")
    folder = Path(next(iter(spec.submodule_search_locations or []))) / "versions"  # type: ignore[union-attr]
    found = (re.search(r"^revision\s*(?::[^=]*)?=\s*[\"']([0-9a-f]+)[\"']", p.read_text(), re.M) for p in folder.glob("*.py"))
    return {m.group(1) for m in found if m}


def newer_schema(db: Path) -> Optional[str]:
    """The schema revision of the sqlite store `db` when this MLflow does not know it (a newer MLflow wrote
    it; opening it would fail, and `mlflow db upgrade` cannot help), else None. Reads the file only."""
    import sqlite3
    from urllib.parse import quote

    try:
        con = sqlite3.connect(f"file:{quote(str(db.resolve()))}?mode=ro", uri=True)
        try:
            row = con.execute("select version_num from alembic_version").fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return None  # no MLflow schema at all: the caller's other checks say so
    if row is None or row[0] in mlflow_revisions():
        return None
    return str(row[0])


def newer_store(db: Path) -> Optional[str]:
    """What to say of a sqlite store a newer MLflow wrote (`newer_schema`), or None."""
    revision = newer_schema(db)
    if revision is None:
        return None
    import mlflow

    return (f"{db} was written by a newer MLflow (schema revision {revision}, unknown to MLflow {mlflow.__version__} "
            "here; left as it is); expected a store this MLflow reads: upgrade MLflow here (pip install -U mlflow), "
            "or use another store")


def prepare_store(uri: str) -> None:
    """Make the store at `uri` usable before anything writes to it, once per process.

    sqlite: the first process creates and migrates the database while holding `<db>.lock`; others
    started at the same moment wait for it instead of migrating the same file at once (which
    breaks it). A file that is not an MLflow store, or one a newer MLflow wrote, is one TrackingError.
    Every URI: a known scheme (`uri_problem`), and an http(s) server or a database (PostgreSQL) that
    answers within PROBE_TIMEOUT_S (`check_uri`).
    """
    if uri in _prepared:
        return
    check_uri(uri)
    db = _sqlite_file(uri)
    if db is not None:
        from mlflow.tracking import MlflowClient

        if db.exists() and not db.is_file():
            raise TrackingError(f"tracking URI {uri!r}: {db} is a folder; expected an MLflow sqlite file")
        newer = newer_store(db) if db.is_file() else None
        if newer is not None:
            raise TrackingError(f"tracking URI {uri!r}: {newer}")
        lock = db.with_name(db.name + ".lock")
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
            lock.touch()
        except OSError as e:  # sqlite writes its journal beside the file: the folder must be writable too
            raise TrackingError(f"tracking URI {uri!r}: cannot write in {db.parent} ({e.strerror or e}); expected a "
                                "writable folder for the MLflow store") from None
        with _file_lock(lock):
            try:
                retry(lambda: MlflowClient(tracking_uri=uri).search_experiments(max_results=1))  # creates / migrates
            except Exception as e:
                first = next((ln for ln in str(e).strip().splitlines() if ln.strip()), type(e).__name__)
                raise TrackingError(f"tracking URI {uri!r}: {db} is not a usable MLflow store ({first[:200]}); "
                                    "expected a file written by MLflow, or a new path") from None
    _prepared.add(uri)


def client(uri: str):
    """An MlflowClient for `uri`, after `prepare_store` (safe creation, reachable server)."""
    from mlflow.tracking import MlflowClient

    prepare_store(uri)
    return MlflowClient(tracking_uri=uri)


# `mlflow ui` (3.x) opens an experiment of this kind on its runs table ("Model training"), not on the
# GenAI traces view; the note is the text the UI shows as the experiment's description.
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
NOTE_TAG = "mlflow.note.content"


def artifact_location(uri: str, name: str) -> Optional[str]:
    """Where a new experiment `name` of the store at `uri` keeps its runs' artifacts: for a sqlite file,
    `mlruns/<name>` beside it, so a store and its artifacts stay together (MLflow's own default is
    ./mlruns under whichever folder the process runs in); a server decides for itself (None)."""
    db = _sqlite_file(uri)
    return None if db is None else (db.resolve().parent / "mlruns" / name).as_uri()


def ensure_experiment(c, name: str, note: str = "") -> str:
    """The experiment id of `ready-<name>`, created on first use (safe when two processes race), its
    artifacts beside a sqlite store (`artifact_location`).

    Tagged as a model-training experiment with `note` as the text the UI shows; an experiment made
    before these tags gets those it lacks (a note edited in the UI is kept)."""
    full = experiment_name(name)
    tags = {EXPERIMENT_KIND_TAG: EXPERIMENT_KIND, **({NOTE_TAG: note} if note else {})}
    exp = retry(lambda: c.get_experiment_by_name(full))
    if exp is None:
        where = artifact_location(c.tracking_uri, full)
        try:
            return retry(lambda: c.create_experiment(full, artifact_location=where, tags=tags))
        except Exception:
            exp = c.get_experiment_by_name(full)
            if exp is None:
                raise
    for key, value in tags.items():
        if key not in exp.tags:
            retry(lambda k=key, v=value: c.set_experiment_tag(exp.experiment_id, k, v))
    return exp.experiment_id


def flatten(tree: Any, prefix: str = "") -> dict[str, str]:
    """{"reader": {"rank": 8}} -> {"reader.rank": "8"}; lists stay one value, `[30, 62]`."""
    if isinstance(tree, DictConfig):
        tree = OmegaConf.to_container(tree, resolve=True)
    out: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return out
