"""The test process itself builds CUDA extensions (the in-process GPU tests of gsplat and
nvdiffrast), so it shares the extension cache and architecture list of Kiln's workers.

What is costly to start and can be shared is started once here and shared by the modules
that ask for it (issue 35: the suite spent most of its time starting the same processes
again): the app served as a person starts it and one Chromium, for the browser modules; one
loopback Ray cluster, for the Ray modules. Each is started at its first use and stopped after
the last test of a run of tests that use it, so it does not idle through the rest of the
suite. Each browser test still gets a browser context of its own (its own cookie: a browser of
its own to the app)."""

import os
from pathlib import Path

import pytest

from worker.child.env import passive_openmp, share_extension_env

share_extension_env()
# The test process renders, bakes and segments in-process too: its OpenMP threads (torch's,
# numba's) sleep when idle, as those of Kiln's own processes do, instead of spinning on the
# two cores that the servers and workers it starts need (worker.child.env.passive_openmp).
passive_openmp(os.environ)

_SHARED: dict = {}   # fixture name -> (its generator, what it yielded)


def _shared(name: str, start):
    """What ``start()`` (a generator function) yields, started once; see pytest_runtest_teardown."""
    if name not in _SHARED:
        gen = start()
        _SHARED[name] = (gen, next(gen))
    return _SHARED[name][1]


def _stop(name: str) -> None:
    gen, _ = _SHARED.pop(name)
    gen.close()   # runs its finally: the server, browser or cluster is stopped


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a test's own teardown: stop each shared thing it used that the next test, in
    another module, does not use."""
    result = yield
    for name in list(_SHARED):
        if name in item.fixturenames and (nextitem is None or (
                nextitem.module is not item.module and name not in nextitem.fixturenames)):
            _stop(name)
    return result


def pytest_sessionfinish(session):
    for name in list(_SHARED):
        _stop(name)


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    """``python -m app`` with browser_helpers' small settings, shared by the browser modules
    whose tests need the plain app (no login); (url, workdir, log path, process). Its fault
    rules (``SHARED_FAULTS``) pick jobs by seeds no other test uses: a job whose seed is
    ``HELD_SEED`` sleeps in its bake until cancelled (a job that must still run when the test
    acts on it, however fast the machine); the first attempt of one whose seed is in
    ``MESH_HELD_SEEDS`` sleeps in 'mesh' until the test kills the worker. Its job store starts
    with an earlier server's job of ``OLD_BROWSER``, removed by the disk budget
    (``leave_a_removed_job``; its id in ``workdir/var/removed_job``)."""
    from browser_helpers import SHARED_CONFIG, SHARED_FAULTS, leave_a_removed_job, require_browser, serve

    require_browser()
    return _shared("shared_server", lambda: serve(tmp_path_factory, "shared-server", config=SHARED_CONFIG,
                                                  extra_env={"KILN_TEST_FAULTS": SHARED_FAULTS},
                                                  before_start=leave_a_removed_job))


@pytest.fixture(scope="module")
def shared_browser():
    """One headless Chromium for the browser modules; tests open contexts of their own in it."""
    from browser_helpers import chromium, require_browser

    require_browser()
    return _shared("shared_browser", chromium)


@pytest.fixture(scope="module")
def server(shared_server):
    """A browser module's app: the shared server's URL (a module that needs more of it, or
    an app of its own, defines its own ``server``)."""
    return shared_server[0]


@pytest.fixture(scope="module")
def browser(shared_browser):
    """A browser module's Chromium: the shared one."""
    return shared_browser


@pytest.fixture(scope="session")
def examples_256(tmp_path_factory):
    """``kiln.examples.write_examples(size=256)`` made once (about a second each time on 2
    cores, and the CLI modules asked for it in nearly every test); read it through ``toy``."""
    from kiln.examples import write_examples

    folder = tmp_path_factory.mktemp("examples-256")
    write_examples(folder, size=256)
    return folder


@pytest.fixture
def toy(examples_256, tmp_path):
    """A fresh copy of the 256 px examples in ``tmp_path / "ex"`` (toy.png, pebble.png,
    toy_rgb.png, toy_mask.png): the test's own files, as when it wrote them itself."""
    import shutil

    return Path(shutil.copytree(examples_256, tmp_path / "ex"))


RAY_RESOURCE = "kiln_gpu"   # the custom resource standing in for a GPU in the Ray modules


def _ray_cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {RAY_RESOURCE: 1}, "node_ip_address": "127.0.0.1"})
    try:
        cluster.wait_for_nodes(timeout=60)
        yield cluster
    finally:
        cluster.shutdown()


@pytest.fixture(scope="module")
def ray_head():
    """One loopback Ray cluster for the Ray modules (a cluster takes ~15-20 s to come up on 2
    cores): a head node with one unit of ``RAY_RESOURCE``. A module that adds a node removes it
    again when it is done, so each module finds the head alone."""
    # read by Ray when it is imported (see tests/test_ray_engine.py)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'kiln3d[ray]')")
    return _shared("ray_head", _ray_cluster)


# Under pytest-xdist (``-n N --dist loadgroup -m "not timing"``, docs/testing.md) each
# module runs whole in one worker, its tests in their order (most modules share a costly
# fixture among their tests: a pool, a server), and the modules that share one of the things
# above, or one folder, run in one worker one after another: the browser modules (the shared
# app and Chromium, test-artifacts/browser), the Ray modules (one loopback cluster). The glTF
# validator and three.js are installed by npm at their first use, each by one module.
XDIST_GROUPS = {"test_browser_": "browser", "test_ray_": "ray"}


def xdist_group(nodeid: str) -> str:
    """The group a test runs in: its module's, or the one XDIST_GROUPS gives its module."""
    path = nodeid.split("::", 1)[0]
    name = path.rsplit("/", 1)[-1]
    return next((g for prefix, g in XDIST_GROUPS.items() if name.startswith(prefix)), path)


# xdist's own loadgroup reads xdist_group marks by renaming each test's node id, which pytest
# 9.2 no longer lets it do (Node.nodeid is read from another attribute): every test then went
# alone to either worker, and a module's pool or server was started in both. So the groups are
# given to xdist's scheduler directly, through its public hook.
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

    return ByGroup(config, log)
