"""Two ``upsguard run`` processes as a pair on real etcd, upsd and vcsim (tests/peers/pair.py).

Whatever happens to the leader, its etcd or both controllers, every VM and host of the
shutdown gets one request, in the plan's order, and the UPS command that brings power back
goes out once; counted at vcsim (its events) and at the UPS's driver (its command log).
Every wait is for something observable (a role in ``status``, an event at vcsim, a run's
end), within a bound only a hang reaches.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.peers.pair import HOSTS, MACHINES, NAMES, TTL_S, VMS, PairLab

pytestmark = [pytest.mark.etcd, pytest.mark.nut, pytest.mark.vcsim, pytest.mark.timeout(240)]


def some_guest_asked(lab: PairLab) -> bool:
    return bool(lab.asked("VmGuestShutdownEvent"))


def shutdown_under_way(lab: PairLab) -> str:
    """Both controllers up, then the mains fail; once the leader's first guest shutdown
    reaches vcsim, the leader's name. The web VMs' guests are held: the run waits there
    until the test lets them go (``lab.release_guests``)."""
    lab.start()
    leader = lab.leader()
    lab.outage(held=True)
    lab.wait(lambda: some_guest_asked(lab), "the leader's first guest shutdown at vcsim")
    return leader


def both_web_vms_claimed(lab: PairLab, name: str) -> None:
    """``name``'s web step claimed both VMs (journaled), one of them waiting for its slot."""
    run = str(lab.status(name)["run"]["id"])

    def claimed() -> bool:
        return {s.step for s in lab.steps(name, run)} >= {"stop:web/web-01", "stop:web/web-02"}

    lab.wait(claimed, f"{name} to claim both web VMs")


def test_kill_9_the_leader_mid_shutdown_the_standby_resumes_and_nothing_is_asked_twice(
    pair_lab: PairLab,
) -> None:
    """The leader dies with a guest shutting down; the standby wins a new term, resumes the
    same run from the shared ledger (it does not start one of its own), waits for the guest
    it finds shutting down instead of asking again, and finishes. How long the takeover
    takes is bench/ha.py's figure, not an assertion here."""
    lab = pair_lab
    leader = shutdown_under_way(lab)
    standby = lab.other(leader)
    before = lab.status(leader)
    run, term = before["run"]["id"], before["ha"]["token"]
    assert before["ha"]["lease_age_s"] is not None

    # the standby follows the leader's run in the shared ledger, and knows who leads once a
    # campaign of its own was answered (its first may time out on a busy machine)
    def following() -> bool:
        ha = lab.status(standby)["ha"]
        return bool(ha["shared_run"] == run and ha["leader"] == leader)

    lab.wait(following, "the standby to see the run and who leads")
    seen = lab.controllers[standby].cli("status").stdout
    assert f"pair: {standby} is STANDBY; {leader} leads, term {term}" in seen
    assert f"run {run}" in seen
    lab.controllers[leader].kill9()

    def resumed() -> bool:
        status = lab.status(standby)
        return status["ha"]["role"] == "leader" and bool(status["service"]["resumed"])

    lab.wait(resumed, "the standby to take over and resume the run", TTL_S + 30)
    lab.release_guests()
    after = lab.status(standby)
    assert after["service"]["resumed"] == run  # the leader's run, not a new one
    assert after["ha"]["token"] > term  # a new term, fenced by a newer revision
    lab.wait(lambda: lab.shutdown_done(standby), "the resumed shutdown to finish", 120)
    lab.assert_each_stopped_once_in_order(last=MACHINES[standby])
    assert lab.ups_commands() == ["shutdown.return"]
    events = lab.events(standby)
    took = [e for e in events if e.kind == "LeadershipChanged" and e.level == "warning"]
    assert took, "the standby journaled no change of role"
    assert {e.run for e in events if e.kind == "RunFinished"} == {run}  # one run, the leader's


def test_a_leader_paused_past_its_lease_starts_nothing_when_it_wakes(pair_lab: PairLab) -> None:
    """SIGSTOP freezes the leader with a guest shutting down, past its lease; the standby
    wins and resumes the run. SIGCONT wakes the old leader in the middle of that run, its own
    executor still holding steps to start (sql01, dc01, the command step, the hosts): its
    clock says its term is over, so it starts none of them (etcd would refuse their claims
    anyway) and becomes the standby. Counted at vcsim and at the command step's log."""
    lab = pair_lab
    old = shutdown_under_way(lab)
    new = lab.other(old)
    run = str(lab.status(old)["run"]["id"])
    lab.pause(old)

    def resumed() -> bool:
        status = lab.status(new)
        return status["ha"]["role"] == "leader" and bool(status["service"]["resumed"] == run)

    lab.wait(resumed, "the standby to take over and resume the run", TTL_S + 30)
    assert lab.status(new)["run"] is not None  # what is left of the run is still to do
    lab.wake(old)
    lab.wait(lambda: lab.role(old) == "standby", "the old leader to see its term is over")
    lab.release_guests()
    lab.wait(lambda: lab.shutdown_done(new), "the resumed shutdown to finish", 120)
    lab.assert_each_stopped_once_in_order(last=MACHINES[new])
    assert lab.command_step_runs() == [new]  # the step left when the old leader stopped
    assert lab.ups_commands() == ["shutdown.return"]
    stopped = lab.run(old, run)
    assert stopped is not None and stopped.state == "interrupted"


def test_a_leader_paused_between_a_claim_and_its_request_asks_nothing_when_it_wakes(
    pair_lab: PairLab,
) -> None:
    """One guest at a time (``max_parallel: 1``): the leader claims the web step for both
    its VMs, asks the first, and the second waits for the slot. SIGSTOP freezes the leader
    right then, between the step's claim and its second request, past its lease; the
    standby wins and resumes the run, and asks the second VM itself. SIGCONT: the old
    leader's second request gets its slot once the first VM is off, and is not made (its
    term ended while it waited); its step and run end interrupted. Counted at vcsim."""
    lab = pair_lab
    lab.configure(vc={"max_parallel": 1})
    old = shutdown_under_way(lab)
    both_web_vms_claimed(lab, old)
    lab.pause(old)
    new = lab.other(old)
    first = lab.asked("VmGuestShutdownEvent")
    assert len(first) == 1 and set(first) <= {"web-01", "web-02"}, first  # the other waits

    def resumed() -> bool:
        status = lab.status(new)
        return status["ha"]["role"] == "leader" and bool(status["service"]["resumed"])

    lab.wait(resumed, "the standby to take over and resume the run", TTL_S + 30)
    run = lab.status(new)["service"]["resumed"]
    lab.release_guests()
    lab.wake(old)
    lab.wait(lambda: lab.role(old) == "standby", "the old leader to see its term is over")
    lab.wait(lambda: lab.shutdown_done(new), "the resumed shutdown to finish", 120)
    lab.assert_each_stopped_once_in_order(last=MACHINES[new])
    assert lab.command_step_runs() == [new]
    assert lab.ups_commands() == ["shutdown.return"]
    (second,) = {"web-01", "web-02"} - set(first)
    (waited,) = [s for s in lab.steps(old, run) if s.step == f"stop:web/{second}"]
    assert waited.state == "interrupted", waited  # claimed, never asked by the old leader
    stopped = lab.run(old, run)
    assert stopped is not None and stopped.state == "interrupted"


def test_the_leader_cut_off_from_etcd_mid_shutdown_lags_behind_the_winner_and_rejoins(
    pair_lab: PairLab,
) -> None:
    """One guest at a time (``max_parallel: 1``): the leader's paths to every etcd member
    are cut with its web step claimed for both VMs and the second waiting for the slot.
    The leader fences itself, and its claim does not outlive its term: the second VM is
    not asked by it. The other controller, which still reaches etcd, wins the lease and
    resumes the run. The cut-off one cannot tell this from etcd losing its quorum: with the
    store silent past its limit and the shutdown due, it goes on alone, lagging each target
    behind the winner, and finds each request under way or the target off. Each VM and host
    is asked once (counted at vcsim); both runs end done; a command step without a status
    command and the UPS's load cycle may come from each (harmless, docs/ha.md). The cut
    holds until the run is over, then the paths come back and the cut-off controller
    rejoins as the standby."""
    lab = pair_lab
    lab.configure(vc={"max_parallel": 1})
    for name in NAMES:
        lab.link_to_store(name)
    leader = shutdown_under_way(lab)
    other = lab.other(leader)
    both_web_vms_claimed(lab, leader)
    lab.cut_from_store(leader)
    first = lab.asked("VmGuestShutdownEvent")
    assert len(first) == 1 and set(first) <= {"web-01", "web-02"}, first  # the other waits

    def resumed() -> bool:
        status = lab.status(other)
        return status["ha"]["role"] == "leader" and bool(status["service"]["resumed"])

    lab.wait(resumed, "the other controller to take over and resume the run", TTL_S + 30)
    run = lab.status(other)["service"]["resumed"]
    lab.release_guests()
    lab.wait(lambda: lab.shutdown_done(other), "the resumed shutdown to finish", 120)
    lab.wait(lambda: lab.status(leader)["run"] is None, "the cut-off controller to stop acting")
    lab.restore_store(leader)
    lab.wait(lambda: lab.role(leader) == "standby", "the cut-off controller to rejoin")
    (second,) = {"web-01", "web-02"} - set(first)
    (waited,) = [s for s in lab.steps(leader, run) if s.step == f"stop:web/{second}"]
    assert waited.state == "interrupted", waited  # its claim did not outlive its term
    assert lab.asked("VmGuestShutdownEvent") == dict.fromkeys(VMS, 1)
    assert lab.asked("HostShutdownEvent") == dict.fromkeys(HOSTS, 1)
    roles = [b["role"] for b in lab.notified("LeadershipChanged") if b["me"] == leader]
    assert "finishing_alone" in roles, roles
    assert lab.status(leader)["last_run"]["state"] == "done", lab.status(leader)["last_run"]
    assert other in lab.command_step_runs()
    assert set(lab.ups_commands()) == {"shutdown.return"}


def test_both_controllers_restart_mid_shutdown_one_resumes_the_run_and_nothing_is_repeated(
    pair_lab: PairLab,
) -> None:
    """Both services restart (SIGTERM to the unit's process group, as ``systemctl restart``
    stops it) with a guest shutting down: each leaves the run interrupted, which the shared
    ledger keeps in progress. Started again, one wins the lease and resumes that same run
    (never one from its own journal, never a new one); the guest it finds shutting down is
    waited for, not asked again, and the other controller stays its standby."""
    lab = pair_lab
    leader = shutdown_under_way(lab)
    run = lab.status(leader)["run"]["id"]
    for name in (leader, lab.other(leader)):
        assert lab.controllers[name].terminate(group=True) == 0
    lab.start()
    winner = lab.leader()
    standby = lab.other(winner)
    lab.wait(
        lambda: lab.status(winner)["service"]["resumed"] == run, "the winner to resume the run"
    )
    lab.release_guests()
    lab.wait(lambda: lab.shutdown_done(winner), "the resumed shutdown to finish", 120)
    lab.assert_each_stopped_once_in_order(last=MACHINES[winner])
    assert lab.ups_commands() == ["shutdown.return"]
    assert lab.status(standby)["service"]["resumed"] is None
    assert lab.role(standby) == "standby"
    finished = [e.run for e in lab.events(winner) if e.kind == "RunFinished"]
    assert run in finished and set(finished) <= {run}  # that run, and no other


def test_the_controllers_disagree_about_the_ups_the_leaders_reading_decides(
    pair_lab: PairLab,
) -> None:
    """The standby loses its path to upsd (the leader keeps its own): the standby sees the
    UPS lost while on line, ``unknown``, and says so in its status; the leader sees it on
    line, and nothing starts. Then the mains go: the leader's reading decides, and it shuts
    the site down while the standby, blind to the UPS, still shows what it reads itself and
    follows the run in the shared ledger. At the controllers' machines the leader hands the
    run over; the standby, unable to send the UPS its load cycle (or to tell whether the
    mains are there), hands it back, and the leader stops both machines, its own last, after
    the UPS command."""
    lab = pair_lab
    lab.link_to_ups("ctl-b")
    lab.start("ctl-a")
    lab.wait(lambda: lab.role("ctl-a") == "leader", "ctl-a to lead")
    lab.start("ctl-b")
    assert lab.leader() == "ctl-a"

    def ups_of(name: str) -> dict[str, Any]:
        (ups,) = lab.status(name)["ups"]
        return dict(ups)

    lab.wait(lambda: ups_of("ctl-b")["link"] == "ok", "the standby to read the UPS")
    lab.links["ctl-b"].cut()
    lab.wait(
        lambda: lab.status("ctl-b")["feeds"][0]["state"] == "unknown",
        "the standby to find the UPS lost past its grace",
    )
    standby = lab.status("ctl-b")
    assert ups_of("ctl-b")["link"] == "lost"
    assert "UPS ups1 cannot be read" in " ".join(a["text"] for a in standby["alerts"])
    assert ups_of("ctl-a")["link"] == "ok" and not ups_of("ctl-a")["on_battery"]
    assert lab.status("ctl-a")["run"] is None

    def read_by_the_other(name: str) -> str | None:
        """The UPS's word in the other controller's view, as ``name`` shows it."""
        others = lab.status(name)["ha"]["others"]
        return str(others[0]["ups"][0]["word"]) if others else None

    lab.wait(lambda: read_by_the_other("ctl-a") == "unknown", "the leader to show ctl-b's")
    assert read_by_the_other("ctl-b") == "online"
    shown = lab.controllers["ctl-a"].cli("status").stdout
    assert "ctl-b (standby) reads" in shown and "UPS ups1: unknown" in shown

    lab.outage()
    lab.wait(lambda: some_guest_asked(lab), "the leader's first guest shutdown at vcsim")
    run = lab.status("ctl-a")["run"]["id"]
    assert ups_of("ctl-a")["on_battery"]
    lab.wait(lambda: lab.status("ctl-b")["ha"]["shared_run"] == run, "the standby to follow")
    said = lab.controllers["ctl-b"].cli("status", check=False)
    assert said.returncode == 1  # a UPS it cannot read: never an all-clear
    seen = said.stdout
    assert "pair: ctl-b is STANDBY; ctl-a leads" in seen
    assert "UPS ups1: OL" in seen and "link lost" in seen  # its own reading, the last it had
    lab.wait(lambda: lab.shutdown_done("ctl-a"), "the leader to finish the run", 120)
    lab.assert_each_stopped_once_in_order(last=MACHINES["ctl-a"])
    assert lab.ups_commands() == ["shutdown.return"]
    assert lab.command_step_runs() == ["ctl-a"]
    by_standby = {s.resource for s in lab.steps("ctl-b", run) if s.state == "done"}
    assert not by_standby & set(MACHINES.values())  # it stopped no machine, blind as it was


def test_the_leader_hands_over_before_its_machine_and_the_other_stops_last(
    pair_lab: PairLab,
) -> None:
    """The leader's own machine is a step of the plan: it hands the run over first, the
    other stops it, sends the UPS its load cycle once, and stops its own machine last."""
    lab = pair_lab
    lab.start()
    leader = lab.leader()
    other = lab.other(leader)
    lab.outage()
    last = lab.wait(lab.finisher, "the handed-over run to be finished", 120)
    first = lab.other(last)
    lab.assert_each_stopped_once_in_order(last=MACHINES[last])
    assert lab.ups_commands() == ["shutdown.return"]
    run = lab.status(last)["service"]["resumed"]
    finished = lab.run(last, run)
    assert finished is not None and finished.state == "done"
    by_last = {s.resource: s for s in lab.steps(last, run) if s.state == "done"}
    assert set(MACHINES.values()) <= set(by_last)
    if last == other:
        handed = lab.run(leader, run)
        assert handed is not None and handed.state == "interrupted"  # handed over, not failed
        # the leader acted on neither controller's machine: the other stopped both
        assert not {s.resource for s in lab.steps(leader, run)} & set(MACHINES.values())
    # its own machine's step started after the UPS took the command that brings power back
    (sent,) = [e for e in lab.events(last) if e.kind == "UpsCommandSent" and e.run == run]
    assert sent.level == "info"  # the UPS took it
    assert sent.at <= by_last[MACHINES[last]].started
    assert by_last[MACHINES[first]].started <= by_last[MACHINES[last]].started


def test_one_etcd_member_stopped_mid_shutdown_changes_nothing(pair_lab: PairLab) -> None:
    """An etcd member stops with a guest shutting down (two of three are a quorum): the
    leader goes on in the same term, the standby stays its standby, and the run ends as it
    would have: the handover, every target asked once, the UPS command once."""
    lab = pair_lab
    leader = shutdown_under_way(lab)
    standby = lab.other(leader)
    term = lab.status(leader)["ha"]["token"]
    lab.etcd.cluster.stop(0)
    lab.release_guests()
    lab.wait(lambda: "sql01" in lab.asked("VmGuestShutdownEvent"), "the run's next guest")
    assert (lab.role(leader), lab.status(leader)["ha"]["token"]) == ("leader", term)
    assert lab.role(standby) == "standby"

    def finisher() -> str | None:
        return next((n for n in (standby, leader) if lab.shutdown_done(n)), None)

    # the standby wins the handover, unless its campaign (through the stopped member first)
    # takes longer than the leader's quiet after it, as on a busy machine: the leader then
    # takes the run back a lease later and finishes it; either way each target once
    done_by = lab.wait(finisher, "the handed-over run to be finished", 120)
    lab.assert_each_stopped_once_in_order(last=MACHINES[done_by])
    assert lab.ups_commands() == ["shutdown.return"]
    alone = [b for b in lab.notified("LeadershipChanged") if b["role"] == "finishing_alone"]
    assert alone == []  # nobody went without the store


def test_etcd_loses_its_quorum_mid_shutdown_both_go_on_alone_and_both_runs_end_done(
    pair_lab: PairLab,
) -> None:
    """Both controllers run; two etcd members of three stop with a guest shutting down. By
    the documented rule the leader goes on alone once the store has been silent past its
    limit, the standby (on battery too, a shutdown due) later, from the shared ledger as it
    last read it. Alone, each reads a target's requests under way before asking it, and the
    former standby lags each step: the former leader asks first, and the standby finds its
    request under way or the target off. Every VM and host is asked once in all (counted at
    vcsim), both runs end done; the UPS command may go out from each (harmless)."""
    lab = pair_lab
    leader = shutdown_under_way(lab)
    standby = lab.other(leader)
    lab.etcd.cluster.stop(0)
    lab.etcd.cluster.stop(1)
    lab.release_guests()

    def alone(name: str) -> bool:
        return lab.role(name) == "finishing_alone"

    lab.wait(lambda: alone(leader) and alone(standby), "both controllers to go on alone")

    def ended(name: str) -> bool:
        status = lab.status(name)
        return status["run"] is None and (status.get("last_run") or {}).get("kind") == "shutdown"

    lab.wait(lambda: ended(leader) and ended(standby), "both runs to end", 120)
    for name in (leader, standby):  # a target the other took down first is done, not failed
        assert lab.status(name)["last_run"]["state"] == "done", lab.status(name)["last_run"]
    guests, hosts = lab.asked("VmGuestShutdownEvent"), lab.asked("HostShutdownEvent")
    assert set(guests) == set(VMS) and set(hosts) == set(HOSTS)
    assert all(n == 1 for n in (*guests.values(), *hosts.values())), (guests, hosts)
    assert set(lab.ups_commands()) == {"shutdown.return"}


def test_after_both_finished_alone_the_site_comes_back_on_mains_and_no_shutdown_returns(
    pair_lab: PairLab,
) -> None:
    """etcd loses its quorum mid-shutdown and both controllers finish alone; the store still
    holds the run in progress as the leader last wrote it (its end was never recorded).
    Then the controllers' machines go off, the mains come back, the etcd members start
    again and both services start (their machines powered on). The one that wins finds the
    run open in the store while the UPS reads on mains: it is over, and no shutdown comes
    back, neither a new run nor the old one resumed, and vcsim is asked nothing more."""
    lab = pair_lab
    leader = shutdown_under_way(lab)
    standby = lab.other(leader)
    lab.etcd.cluster.stop(0)
    lab.etcd.cluster.stop(1)
    lab.release_guests()

    def ended(name: str) -> bool:
        status = lab.status(name)
        return status["run"] is None and (status.get("last_run") or {}).get("kind") == "shutdown"

    lab.wait(lambda: ended(leader) and ended(standby), "both runs to end alone", 120)
    asked = lab.seen()
    journaled = {name: max(e.id for e in lab.events(name)) for name in NAMES}
    for name in NAMES:  # their machines are off: systemd stopped each service
        assert lab.controllers[name].terminate(group=True) == 0
    lab.mains_back()
    lab.etcd.cluster.heal()
    lab.start()
    winner = lab.leader()
    other = lab.other(winner)

    def settled() -> bool:
        """The winner reads the UPS on line and has no run; the store holds none either."""
        status = lab.status(winner)
        (ups,) = status["ups"]
        on_mains = ups["link"] == "ok" and not ups["on_battery"]
        shared = lab.status(other)["ha"]["shared_run"]
        return on_mains and status["run"] is None and shared is None

    lab.wait(settled, "the winner on mains, with no run in the store")
    assert lab.status(winner)["phase"] != "shutting_down"
    assert lab.seen() == asked  # vcsim was asked nothing more
    for name in NAMES:
        started = [e for e in lab.events(name) if e.id > journaled[name] and e.kind == "RunStarted"]
        assert started == [], (name, [(e.text, e.payload) for e in started])
    assert lab.status(winner)["run"] is None and lab.status(other)["run"] is None


def test_with_etcd_out_of_reach_the_controller_still_shuts_the_site_down_and_says_so(
    pair_lab: PairLab,
) -> None:
    """Never missing a shutdown outranks never acting twice: the store loses its quorum (two
    members of three stop) just before the outage; the leader fences itself, then, with the
    store silent past its limit and a shutdown due, goes on alone: it journals and notifies
    it, and shuts the whole site down, the UPS's load cycle before its own machine."""
    lab = pair_lab
    alone = "ctl-a"
    lab.start(alone)  # its pair's controller is gone: nobody else would act
    lab.wait(lambda: lab.role(alone) == "leader", "ctl-a to lead")
    lab.etcd.cluster.stop(0)
    lab.etcd.cluster.stop(1)
    lab.outage()
    lab.wait(lambda: lab.shutdown_done(alone), "the shutdown to finish without the store", 120)
    lab.assert_each_stopped_once_in_order(last=MACHINES[alone])
    assert lab.ups_commands() == ["shutdown.return"]
    assert lab.status(alone)["ha"]["role"] == "finishing_alone"
    roles = [body["role"] for body in lab.notified("LeadershipChanged")]
    assert "leader" in roles and roles[-1] == "finishing_alone", roles
    journaled = [e for e in lab.events(alone) if e.kind == "LeadershipChanged"]
    assert len(journaled) == len(roles)  # each change journaled, and notified


def test_before_the_step_that_takes_etcds_quorum_down_the_controller_finishes_alone(
    pair_lab: PairLab,
) -> None:
    """The etcd members run on a host of the plan and on the two controllers' machines
    (``store_machines``). The host stops first (two members left: a quorum); after the
    handover, stopping the first controller's machine would leave one: the other controller
    says in etcd that it finishes alone, journals and notifies it, and finishes the run."""
    lab = pair_lab
    lab.configure(store_machines=[HOSTS[0], *MACHINES.values()])
    lab.start()
    leader = lab.leader()
    other = lab.other(leader)
    lab.outage()
    lab.wait(lambda: lab.shutdown_done(other), "the other controller to finish the run", 120)
    lab.assert_each_stopped_once_in_order(last=MACHINES[other])
    assert lab.ups_commands() == ["shutdown.return"]
    alone = [b for b in lab.notified("LeadershipChanged") if b["role"] == "finishing_alone"]
    assert [b["me"] for b in alone] == [other]
    said = f"finishing alone: stopping {MACHINES[leader]} leaves 1 of"
    assert alone[0]["detail"].startswith(said), alone[0]
    # here the etcd members outlive "their" machines (vcsim's VMs), so the store still
    # answers once the run is over, and the controller rejoins the pair at its next poll;
    # on a site the store went down with them, and it goes on alone
    ha = lab.status(other)["ha"]
    if ha["role"] == "finishing_alone":
        assert ha["alone"].startswith(f"{other}: stopping {MACHINES[leader]} leaves 1 of")
