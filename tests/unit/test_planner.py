"""Plan order: what must stop first stops first, and startup is the mirror image."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.runs import steps_by_id
from tests.sites import EXAMPLES, simple_site, site_from
from upsguard.config import SiteConfig, load_site
from upsguard.errors import ConfigError
from upsguard.models import (
    CacheName,
    Direction,
    PlatformName,
    ResourceId,
    ResourceKind,
    StepId,
    Target,
)
from upsguard.runbooks import render
from upsguard.runbooks.plan import Action, LearnedDuration, Plan, Quorum
from upsguard.runbooks.planner import Planner
from upsguard.runbooks.schedule import finish_with_destage

VC = PlatformName("vc")


def position(plan: Plan) -> dict[str, int]:
    return {s.id.split(":", 1)[1]: i for i, s in enumerate(plan.steps)}


@st.composite
def random_dags(draw: st.DrawFn) -> tuple[int, list[tuple[int, int]]]:
    size = draw(st.integers(min_value=1, max_value=25))
    edges = draw(
        st.lists(
            st.tuples(st.integers(0, size - 1), st.integers(0, size - 1)).filter(
                lambda e: e[0] < e[1]
            ),
            max_size=60,
        )
    )
    return size, edges


def dag_site(size: int, edges: list[tuple[int, int]]) -> SiteConfig:
    """Node i depends on node j when (i, j) is an edge with i < j: always acyclic."""
    deps: dict[int, list[str]] = {i: [] for i in range(size)}
    for a, b in edges:
        deps[a].append(f"r{b}")
    resources = [
        {"id": f"r{i}", "kind": "vm", "platform": "sim", "depends_on": sorted(set(deps[i]))}
        for i in range(size)
    ]
    return SiteConfig.model_validate(
        {
            "site": "dag",
            "ups": [{"name": "u", "simulated": {}}],
            "platforms": {"sim": {"type": "simulated", "max_parallel": 3}},
            "resources": resources,
        }
    )


@given(random_dags())
def test_any_dag_shutdown_respects_every_edge_and_startup_reverses_it(
    dag: tuple[int, list[tuple[int, int]]],
) -> None:
    size, edges = dag
    site = dag_site(size, edges)
    down = position(Planner(site).plan("shutdown"))
    up = position(Planner(site).plan("startup"))
    assert len(down) == len(up) == size
    for a, b in edges:  # a depends on b: a stops first, b starts first
        assert down[f"r{a}"] < down[f"r{b}"]
        assert up[f"r{b}"] < up[f"r{a}"]
    for plan_dir in ("shutdown", "startup"):
        plan = Planner(site).plan(plan_dir)
        seen: set[str] = set()
        for step in plan.steps:
            assert set(step.waits_for) <= seen  # every step after what it waits for
            seen.add(step.id)
        assert plan.critical_path_s <= plan.estimate_s + 1e-6


def test_vms_before_their_host_hosts_before_storage_switch_stays_up(tmp_path: Path) -> None:
    plan = Planner(site_from(tmp_path, simple_site())).plan("shutdown")
    order = position(plan)
    assert order["web"] < order["app"] < order["db"] < order["h1"]
    assert order["app"] < order["h2"] and order["web"] < order["h2"]
    assert order["h1"] < order["nas"] and order["h2"] < order["nas"]
    assert "sw" not in order  # a switch without a platform goes down with the UPS
    startup = position(Planner(site_from(tmp_path, simple_site())).plan("startup"))
    assert startup["nas"] < startup["h1"] < startup["db"] < startup["app"] < startup["web"]


def test_steps_wait_only_for_what_they_need(tmp_path: Path) -> None:
    plan = Planner(site_from(tmp_path, simple_site())).plan("shutdown")
    steps = steps_by_id(plan)
    assert steps["stop:h1"].waits_for == ("stop:db",)
    assert set(steps["stop:h2"].waits_for) == {"stop:app", "stop:web"}
    assert steps["stop:web"].waits_for == ()
    assert steps["stop:web"].members == 4


def test_switch_with_a_platform_goes_last_and_comes_up_first(tmp_path: Path) -> None:
    data = simple_site()
    data["resources"][-1] = {
        "id": "sw",
        "kind": "switch",
        "platform": "dev",
        "stop": True,
        "start": True,
    }
    site = site_from(tmp_path, data)
    down = Planner(site).plan("shutdown")
    assert down.steps[-1].id == "stop:sw"
    assert Planner(site).plan("startup").steps[0].id == "start:sw"


def test_upsguard_machine_goes_last_and_what_it_needs_is_left_to_the_ups(tmp_path: Path) -> None:
    data = simple_site()
    data["resources"].append(
        {
            "id": "mgmt",
            "kind": "host",
            "platform": "dev",
            "runs_upsguard": True,
            "depends_on": ["nas"],
        }
    )
    plan = Planner(site_from(tmp_path, data)).plan("shutdown")
    assert plan.steps[-1].id == "stop:mgmt"
    assert plan.left_to_ups == ("nas",)
    assert "stop:nas" not in steps_by_id(plan)
    assert "lose power with the UPS" in plan.notes[0]


def test_manager_stops_after_what_it_manages_and_later_steps_go_direct(tmp_path: Path) -> None:
    data = simple_site()
    data["resources"].insert(
        0,
        {
            "id": "vcsa",
            "kind": "vm",
            "platform": "vc",
            "runs_on": ["h1"],
            "serves_platform": "vc",
            "depends_on": ["db"],
        },
    )
    plan = Planner(site_from(tmp_path, data)).plan("shutdown")
    order, steps = position(plan), steps_by_id(plan)
    assert order["app"] < order["vcsa"] and order["web"] < order["vcsa"]
    assert order["vcsa"] < order["db"] < order["h1"]  # vcsa needs db: db stops after it
    assert steps["stop:db"].direct and steps["stop:h1"].direct
    assert not steps["stop:app"].direct and not steps["stop:vcsa"].direct
    assert "directly on the host" in steps["stop:h1"].description


def test_hardware_in_a_cache_data_path_waits_for_it(tmp_path: Path) -> None:
    data = simple_site()
    data["caches"] = [{"name": "flash", "provider": "simulated", "carries": ["db"]}]
    steps = steps_by_id(Planner(site_from(tmp_path, data)).plan("shutdown"))
    assert steps["stop:h1"].caches == ("flash",)  # db runs on h1
    assert steps["stop:nas"].caches == ("flash",)  # h1 stores on nas
    assert steps["stop:h2"].caches == ()  # app only needs db: h2 is not in the data path
    assert steps["stop:db"].caches == ()


def test_a_destage_runs_beside_the_guests_and_holds_back_only_what_waits_for_it(
    tmp_path: Path,
) -> None:
    """The destage goes on while the guests shut down: the time a shutdown needs is the longer
    of the path to the host steps that wait for it and the destage, then the rest; not the
    plan plus the destage (which started a whole shutdown on full batteries)."""
    data = simple_site()
    data["caches"] = [{"name": "flash", "provider": "simulated", "carries": ["db"]}]
    plan = Planner(site_from(tmp_path, data)).plan("shutdown")
    h1, nas = 120, 60  # h1 and nas wait for flash; h2 does not
    assert finish_with_destage(plan, {}) == plan.estimate_s
    assert finish_with_destage(plan, {CacheName("flash"): 30}) == plan.estimate_s  # in the path
    assert finish_with_destage(plan, {CacheName("flash"): 900}) == 900 + h1 + nas


def test_shedding_plan_includes_what_must_stop_first(tmp_path: Path) -> None:
    site = site_from(tmp_path, simple_site())
    plan = Planner(site).plan("shutdown", {ResourceId("app")})
    assert [s.id for s in plan.steps] == ["stop:web", "stop:app"]


def test_live_inventory_expands_groups_and_places_vms(tmp_path: Path) -> None:
    data = simple_site()
    data["resources"][2].pop("runs_on")
    site = site_from(tmp_path, data)
    vm = ResourceKind.VM
    inventory = {
        ResourceId("web"): [
            Target(VC, vm, "web-1", host="h1"),
            Target(VC, vm, "web-2", host="h2"),
        ]
    }
    steps = steps_by_id(Planner(site, inventory).plan("shutdown"))
    assert "stop:web/web-1" in steps["stop:h1"].waits_for
    assert "stop:web/web-2" in steps["stop:h2"].waits_for
    assert steps["stop:web/web-1"].waits_for == ()
    assert steps["stop:web/web-1"].member and steps["stop:web/web-1"].resource == "web"
    assert not steps["stop:h1"].member  # the journal learns members' figures apart


def test_plan_text_tells_vms_without_tools_from_the_rest(tmp_path: Path) -> None:
    data = simple_site()
    data["resources"][2].pop("runs_on")
    data["resources"][1]["fallback"] = "fail"
    site = site_from(tmp_path, data)
    vm = ResourceKind.VM
    inventory = {
        ResourceId("db"): [Target(VC, vm, "db", host="h1", graceful=False)],
        ResourceId("app"): [Target(VC, vm, "app", host="h2", graceful=False)],
        ResourceId("web"): [
            Target(VC, vm, "web-1", host="h1", graceful=True),
            Target(VC, vm, "web-2", host="h2"),
        ],
    }
    steps = steps_by_id(Planner(site, inventory).plan("shutdown"))
    assert steps["stop:db"].description.endswith("; no VMware Tools: powered off at once")
    assert steps["stop:app"].description.endswith("; no VMware Tools: the step fails")
    assert "VMware Tools" not in steps["stop:web/web-1"].description
    assert "VMware Tools" not in steps["stop:web/web-2"].description  # not known: no claim
    data["resources"][0]["fallback"] = "skip"
    with_skip = steps_by_id(Planner(site_from(tmp_path, data), inventory).plan("shutdown"))
    assert with_skip["stop:db"].description.endswith("; no VMware Tools: left running (skip)")


def test_vms_of_unknown_placement_go_down_before_any_host(tmp_path: Path) -> None:
    data = simple_site()
    data["resources"][0].pop("runs_on")
    plan = Planner(site_from(tmp_path, data)).plan("shutdown")
    barrier = "stop:vc:vms-of-unknown-placement"
    steps = steps_by_id(plan)
    assert steps[barrier].action is Action.BARRIER
    assert "stop:db" in steps[barrier].waits_for
    assert barrier in steps["stop:h1"].waits_for and barrier in steps["stop:h2"].waits_for


def test_critical_path_and_parallelism(tmp_path: Path) -> None:
    data = simple_site()
    data["platforms"]["vc"]["max_parallel"] = 2
    plan = Planner(site_from(tmp_path, data)).plan("shutdown")
    assert plan.critical_path == ("stop:web", "stop:app", "stop:db", "stop:h1", "stop:nas")
    # web: 4 VMs two at a time = 2 rounds of 40 s; app 40 s, db 40 s, h1 2 min, nas 1 min
    assert plan.critical_path_s == 80 + 40 + 40 + 120 + 60
    assert plan.estimate_s >= plan.critical_path_s


def test_text_json_dot_mermaid(tmp_path: Path) -> None:
    plan = Planner(site_from(tmp_path, simple_site())).plan("shutdown")
    text = render.plan_text(plan)
    assert "* = on the critical path: stop:web -> stop:app" in text
    assert "guest shutdown of 4 VMs of group web (name web-*), power off after 5m" in text
    data = json.loads(render.plan_json(plan))
    assert [s["id"] for s in data["steps"]][:2] == ["stop:web", "stop:app"]
    assert '"stop:db" -> "stop:h1";' in render.plan_dot(plan)
    assert "flowchart LR" in render.plan_mermaid(plan)


def test_dot_and_mermaid_escape_quotes_and_backslashes_in_ids(tmp_path: Path) -> None:
    """Defect this reproduces (it failed before the fix): a resource id with a ``"`` ended
    the quoted id early in DOT and the label in Mermaid, and a trailing ``\\`` escaped DOT's
    closing quote; ``dot`` and Mermaid refused the graph, or drew other nodes."""
    data = simple_site()
    data["resources"] = [
        {"id": 'say "hi"', "kind": "vm", "platform": "vc", "runs_on": ["h1"]},
        {"id": "back\\", "kind": "vm", "platform": "vc", "runs_on": ["h1"]},
        {"id": "h1", "kind": "host", "platform": "vc"},
    ]
    plan = Planner(site_from(tmp_path, data)).plan("shutdown")

    dot = render.plan_dot(plan)
    assert '"stop:say \\"hi\\"" -> "stop:h1";' in dot
    assert '"stop:back\\\\" -> "stop:h1";' in dot
    for line in dot.splitlines():  # every quote left in a line opens or closes a string
        unescaped = line.replace("\\\\", "").replace('\\"', "")
        assert unescaped.count('"') % 2 == 0, line

    mermaid = render.plan_mermaid(plan)
    assert '["stop:say #quot;hi#quot; ~40s"]' in mermaid
    for line in mermaid.splitlines():
        assert line.count('"') in (0, 2), line


def test_examples_plan_cleanly() -> None:
    for name in ("homelab.yaml", "cluster.yaml"):
        site = load_site(EXAMPLES / name)
        for direction in ("shutdown", "startup"):
            plan = Planner(site).plan(direction)
            assert plan.steps


def test_a_cache_that_carries_a_host_gates_that_host(tmp_path: Path) -> None:
    data = simple_site()
    data["caches"] = [{"name": "raid", "provider": "simulated", "carries": ["h2"]}]
    steps = steps_by_id(Planner(site_from(tmp_path, data)).plan("shutdown"))
    assert steps["stop:h2"].caches == ("raid",) and steps["stop:nas"].caches == ("raid",)
    assert steps["stop:h1"].caches == ()


def test_a_group_of_unknown_placement_puts_every_host_it_could_be_on_in_the_data_path(
    tmp_path: Path,
) -> None:
    data = simple_site()
    data["resources"][2].pop("runs_on")  # web-*: nobody says where they run
    data["caches"] = [{"name": "flash", "provider": "simulated", "carries": ["web"]}]
    steps = steps_by_id(Planner(site_from(tmp_path, data)).plan("shutdown"))
    assert steps["stop:h1"].caches == ("flash",) and steps["stop:h2"].caches == ("flash",)


def test_a_host_that_needs_a_vm_live_inventory_finds_on_it_is_a_cycle_said_in_one_line(
    tmp_path: Path,
) -> None:
    """The site file runs db on h1; h2 needs db. Live inventory finds db moved to h2: the
    planner's ``ValueError: the plan has a cycle`` came out as a traceback."""
    data = simple_site()
    data["resources"][4]["depends_on"] = ["nas", "db"]  # h2
    site = site_from(tmp_path, data)
    Planner(site).plan("shutdown")  # as the site file places it: no cycle
    moved = {ResourceId("db"): [Target(VC, ResourceKind.VM, "db", host="h2")]}
    with pytest.raises(ConfigError) as info:
        Planner(site, moved)
    (problem,) = info.value.problems
    assert problem.startswith(
        "resources[4].depends_on[1]: cycle: h2 -> db -> h2 (live inventory finds db on h2): "
        "a host cannot need a VM that runs on it; drop the dependency, or run the VM "
        f"elsewhere ({tmp_path / 'site.yaml'}:"
    )


def test_the_startup_waits_for_hosts_to_be_up_before_vms_of_unknown_placement(
    tmp_path: Path,
) -> None:
    """It said "wait until every VM of unknown placement is down" in a startup."""
    data = simple_site()
    data["resources"][0].pop("runs_on")
    planner = Planner(site_from(tmp_path, data))
    barrier = steps_by_id(planner.plan("startup"))["start:vc:vms-of-unknown-placement"]
    assert barrier.waits_for == ("start:h1", "start:h2")
    assert barrier.description == (
        "wait until every host of vc is up: VMs of unknown placement may run on any of them"
    )
    down = steps_by_id(planner.plan("shutdown"))["stop:vc:vms-of-unknown-placement"]
    assert down.description == "wait until every VM of unknown placement on vc is down"


def test_the_controllers_own_boot_is_not_part_of_the_startup_it_runs() -> None:
    """start:mgmt01 counted 5 minutes on the startup's critical path: the controller cannot be
    running the startup before its own machine is up."""
    site = load_site(EXAMPLES / "cluster.yaml")
    learned = {(ResourceId("mgmt01"), Direction.STARTUP): LearnedDuration(200.0, 240.0, 5)}
    for planner in (Planner(site), Planner(site, durations=learned)):
        plan = planner.plan("startup")
        own = plan.step(StepId("start:mgmt01"))
        assert own.estimate_s == 0.0
        assert own.estimate_source == "up before the startup"
        assert render.plan_text(plan).startswith("startup plan: 13 steps, about 21m30s")


def test_hosts_powered_on_by_their_bmc_do_not_wait_for_vcenter() -> None:
    """start:esx02 and start:esx03 waited for start:vcenter, though their BMCs power them on
    and vCenter is not needed to reach them (direct_hosts): 5 minutes lost on the cluster."""
    site = load_site(EXAMPLES / "cluster.yaml")
    steps = steps_by_id(Planner(site).plan("startup"))
    for host in ("esx02", "esx03"):
        step = steps[StepId(f"start:{host}")]
        assert step.waits_for == ("start:nas01",)
        assert step.direct
    assert "start:vcenter" in steps[StepId("start:dc02")].waits_for  # vCenter starts its VMs
    shutdown = steps_by_id(Planner(site).plan("shutdown"))  # vCenter still stops them first
    assert "stop:esx02" in shutdown[StepId("stop:vcenter")].waits_for


def test_without_direct_access_a_host_waits_for_its_manager_to_start(tmp_path: Path) -> None:
    data = yaml.safe_load((EXAMPLES / "cluster.yaml").read_text())
    del data["platforms"]["vcenter"]["direct_hosts"]
    steps = steps_by_id(Planner(site_from(tmp_path, data)).plan("startup"))
    assert "start:vcenter" in steps[StepId("start:esx02")].waits_for


def test_a_proxmox_cluster_shuts_down_in_its_vendors_order() -> None:
    """HA disarmed before any guest, the Ceph flags once the guests are down and before any
    node, the node without a monitor before the monitor nodes, upsguard's own box last; the
    plan marks where the cluster's quorum ends, after its HA and Ceph steps."""
    site = load_site(EXAMPLES / "proxmox-ceph.yaml")
    planner = Planner(site)
    shutdown, startup = planner.plan("shutdown"), planner.plan("startup")
    order = [str(s.id) for s in shutdown.steps]

    def before(a: str, b: str) -> bool:
        return order.index(a) < order.index(b)

    for guest in ("stop:web", "stop:db01", "stop:dns01"):
        assert before("stop:pve-ha", guest) and before(guest, "stop:pve-ceph")
    for node in ("stop:pve1", "stop:pve2", "stop:pve3"):
        assert before("stop:pve-ceph", node)
        assert "stop:pve-ceph" in shutdown.step(StepId(node)).waits_for
    assert "stop:pve1" in shutdown.step(StepId("stop:pve2")).waits_for
    assert "stop:pve1" in shutdown.step(StepId("stop:pve3")).waits_for
    assert order[-1] == "stop:mgmt01"
    [ends] = [s for s in shutdown.steps if s.quorum_ends is not None]
    assert ends.id == "stop:pve2" and ends.quorum_ends == Quorum(PlatformName("pve"), 2, 3)
    assert "cluster pve loses its quorum here (2 of 3 nodes down)" in render.plan_text(shutdown)
    back = [str(s.id) for s in startup.steps]
    assert back.index("start:pve2") < back.index("start:pve1")  # monitors first
    assert back.index("start:pve1") < back.index("start:pve-ceph") < back.index("start:dns01")
    assert back[-1] == "start:pve-ha"  # once the guests are up
