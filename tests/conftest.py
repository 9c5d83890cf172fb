"""Shared pytest fixtures.

Tests that need real data read it from the data root given by ``FEDRUN_DATA`` (CI points it at
``../shared/data``); without it they look at ``../shared/data`` beside the checkout, and are skipped
with a message when neither holds the files.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib.util
import os
import shutil
import sys
import warnings
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def _absl_handler_on_the_process_stderr() -> None:
    """dp_accounting imports absl, whose logging handler keeps the stderr of the moment it is made (pytest's
    capture file during collection) and closes it when Hydra's logging setup in an in-process ``fedrun`` call
    closes every handler: the session then dies with 'I/O operation on closed file'. The process's own stderr
    is never closed by absl."""
    try:
        from absl import logging as absl_logging
    except ImportError:
        return
    absl_logging.get_absl_handler().python_handler.setStream(sys.__stderr__)


_absl_handler_on_the_process_stderr()


def _shared_data() -> Path | None:
    env = os.environ.get("FEDRUN_DATA")
    candidates = [Path(env)] if env else []
    candidates.append(REPO.parent / "shared" / "data")
    for c in candidates:
        if c.is_dir():
            return c
    return None


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Read-only folder with the real datasets (MNIST/, FashionMNIST/, FEMNIST/, lending-club/)."""
    root = _shared_data()
    if root is None:
        pytest.skip("no data root: set FEDRUN_DATA to the folder with MNIST/, FashionMNIST/, FEMNIST/, lending-club/")
    return root


_DATA_ENV = ("FEDRUN_DATA", "FEDRUN_CACHE", "XDG_CACHE_HOME", "HOME")
#: test images a run in this process evaluates on (of 10,000 for MNIST / Fashion-MNIST, 3,358 for FEMNIST):
#: evaluation is most of a small run's cost; the training split is kept whole, so federations are unchanged
SMALL_TEST_SPLIT = 2_000


def _fingerprint(d) -> tuple:
    return tuple(float(t.double().sum()) for t in (d.x_train, d.y_train, d.x_test, d.y_test))


class _Datasets:
    """``fedrun.run.load_dataset`` memoised on its arguments and the variables that decide where data are looked
    for (a test with its own data folder or cache gets its own load); loads of the same files with the same
    content share one Dataset, so memory holds each dataset once."""

    def __init__(self, load):
        self.load = load
        self.memo: dict = {}
        self.by_content: dict = {}

    def full(self, name, data_root=None, *args, **kwargs):
        key = (name, str(data_root), args, tuple(sorted(kwargs.items())), tuple(os.environ.get(v) for v in _DATA_ENV))
        if key not in self.memo:
            d = self.load(name, data_root, *args, **kwargs)
            fp = _fingerprint(d)
            self.memo[key] = (self.by_content.setdefault((d.name, d.source, fp), d), fp)
        return self.memo[key][0]

    def small_test_split(self, name, data_root=None, *args, **kwargs):
        d = self.full(name, data_root, *args, **kwargs)
        if len(d.y_test) <= SMALL_TEST_SPLIT:
            return d
        cut = {"x_test": d.x_test[:SMALL_TEST_SPLIT], "y_test": d.y_test[:SMALL_TEST_SPLIT]}
        if d.groups_test is not None:
            cut["groups_test"] = d.groups_test[:SMALL_TEST_SPLIT]
        return dataclasses.replace(d, **cut)  # views: no copy


@pytest.fixture(scope="session", autouse=True)
def _datasets_loaded_once():
    """Runs in this process (run(cfg), build(cfg), a transfer scheme's source data) load each dataset once per
    session, and evaluate on the first SMALL_TEST_SPLIT test samples (a test that needs the whole test split takes
    the ``full_test_split`` fixture). A run never changes its Dataset; the teardown checks that none did."""
    import fedrun.data.sources as sources
    import fedrun.run as run_module

    original = sources.load_dataset
    cache = _Datasets(original)
    sources.load_dataset = run_module.load_dataset = cache.small_test_split
    yield cache
    sources.load_dataset = run_module.load_dataset = original
    changed = [k[0] for k, (d, fp) in cache.memo.items() if _fingerprint(d) != fp]
    assert not changed, f"a test changed the shared dataset(s) {changed} in place"


@pytest.fixture
def full_test_split(_datasets_loaded_once, monkeypatch):
    """Runs in this test evaluate on the whole test split (still loaded once per session)."""
    import fedrun.data.sources as sources
    import fedrun.run as run_module

    monkeypatch.setattr(run_module, "load_dataset", _datasets_loaded_once.full)
    monkeypatch.setattr(sources, "load_dataset", _datasets_loaded_once.full)


@pytest.fixture(scope="session", autouse=True)
def mlflow_store_template(tmp_path_factory):
    """A new SQLite MLflow store made in this process is a copy of one made once per session, instead of MLflow's
    ~50 schema migrations (seconds each time); the copy is the same file the migrations give. The fixture's value,
    ``mlflow_store_template(path)``, puts such a copy at ``path`` (a store a `fedrun` process will open), or is
    None with an MLflow that makes its stores another way."""
    try:
        import sqlalchemy
        from mlflow.store.db import utils as db_utils
    except ImportError:
        yield None
        return
    original = getattr(db_utils, "_initialize_tables", None)
    if original is None:
        yield None
        return
    template = tmp_path_factory.mktemp("mlflow_template") / "mlflow.db"

    def copy_to(path) -> None:
        if not template.exists():
            blank = sqlalchemy.create_engine(f"sqlite:///{template}")
            with warnings.catch_warnings():  # MLflow's models on SQLAlchemy's deprecations (its own filter is by module)
                warnings.simplefilter("ignore", DeprecationWarning)
                original(blank)
            blank.dispose()
        shutil.copyfile(template, path)

    def initialize_tables(engine):
        url = engine.url
        if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
            return original(engine)
        engine.dispose()  # no connection keeps the empty file open
        copy_to(url.database)

    db_utils._initialize_tables = initialize_tables
    yield copy_to
    db_utils._initialize_tables = original


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """Give the memory a test freed back to the system: glibc keeps freed heap pages (torch's mid-sized buffers),
    and over hundreds of tests the process would hold a GB more than it uses."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


try:
    _LIBC = ctypes.CDLL("libc.so.6")
    _LIBC.malloc_trim
except (OSError, AttributeError):  # not glibc
    _LIBC = None


@pytest.fixture(autouse=True)
def _few_threads():
    # Keep tests predictable on the 2-core CI machine.
    torch.set_num_threads(2)
    yield


CONF_DIR = str(REPO / "conf")

# Small settings for integration runs on the 2-core CI machine.
FAST = ["~experiment", "scheme=fl_std", "dp=false", "r=1.0", "eval_every=1", "lr=0.05", "local_mode=sgd", "sampler=poisson", "rounds=2", "num_clients=10", "sample_rate=0.5", "local_steps=2",
        "batch_size=10", "clients_per_round=10", "clipping_norm=1.0", "tracking=none",
        "progress=off"]


def compose(overrides: list[str]):
    """The resolved fedrun config for ``overrides`` (Hydra compose API, as the CLI would build it)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)


@pytest.fixture
def fast_cfg(shared_data):
    """compose() with the fast settings and the shared data root."""

    def make(*overrides: str):
        return compose(FAST + [f"data_root={shared_data}", *overrides])

    return make


@pytest.fixture
def fedrun_in_process(tmp_path, monkeypatch, capsys):
    """``fedrun_in_process(args)``: the `fedrun` Hydra app called in this process, in ``tmp_path``, as the console
    script calls it: (exit status, stdout, stderr). The same code path as the command without a new interpreter
    (seconds of imports) per call; the root logger's handlers are put back afterwards."""
    import logging
    import logging.config

    from hydra.core.global_hydra import GlobalHydra

    from fedrun import cli

    monkeypatch.chdir(tmp_path)

    def _forget_handlers_without_closing_them() -> None:
        # logging.config.dictConfig (Hydra's job logging) closes every handler it replaces; in a test process
        # those include handlers on pytest's capture files (absl's, pytest's own), and a closed capture file
        # ends the whole session ('I/O operation on closed file'). The command itself is unchanged.
        logging._handlers.clear()
        del logging._handlerList[:]

    monkeypatch.setattr(logging.config, "_clearExistingHandlers", _forget_handlers_without_closing_them)

    def call(args):
        GlobalHydra.instance().clear()
        monkeypatch.setattr(sys, "argv", ["fedrun", *args])
        before, level = list(logging.root.handlers), logging.root.level
        if not os.environ.get("MLFLOW_TRACKING_URI"):  # the default store, ./mlflow.db, by its absolute path:
            # MLflow keeps one store per URI string for the process, a relative one in the first test's folder
            monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
        capsys.readouterr()
        try:
            cli.main()
            code = 0
        except SystemExit as exc:
            code = exc.code
        finally:
            for h in [h for h in logging.root.handlers if h not in before]:
                logging.root.removeHandler(h)
                h.close()
            for h in before:  # Hydra's logging config replaced the root logger's handlers
                if h not in logging.root.handlers:
                    logging.root.addHandler(h)
            logging.root.setLevel(level)
        out = capsys.readouterr()
        return code, out.out, out.err

    return call


@pytest.fixture
def load_script(monkeypatch):
    """``load_script("name")``: ``scripts/name.py`` imported as a module (the scripts are CLIs, not a package);
    registered in ``sys.modules`` for the test, which dataclasses in a script need."""

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, mod)
        spec.loader.exec_module(mod)
        return mod

    return load
