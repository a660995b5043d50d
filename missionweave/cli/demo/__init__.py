"""``mwp demo``: one complete small Mission against a running mesh, narrated event by event.

Four fresh identities (a unique suffix per run, so the demo can run again and again) act in-process,
each with its own generated key and session: a human MissionOwner, a Coordinator agent and two
Worker agents. The owner creates a Mission and admits the Workers; the Coordinator plans a DAG of
five WorkItems and offers each one with structured selection criteria once its dependencies are
verified. The Workers are Worker runtimes (``missionweave.sdk.worker``), each an agent on the
gateway: the runtime answers an offer after admission control by the Worker's own scheduler,
places accepted work into its slot, starts it under an execution lease and submits what the demo's
handler made: a real deliverable, which reads the upstream WorkItems' Artifacts through its slot and
is stored through it (uploaded with a manifest signed under the lease, its inputs as sources), and
Evidence for every acceptance criterion; the handler reports usage under the lease. The Coordinator verifies each result. On the way one Worker
is preempted cooperatively (its handler stops at a safe point, the runtime checkpoints and the work
resumes later), one handler saves a draft checkpoint and carries on from it, and one WorkItem fails
transiently and is retried. Finally the Coordinator submits the Mission and the owner approves it.

The timeline is the Group's log as the MissionOwner reads it, each event when it arrived.
``run_demo(mesh, admin_key, target=...)`` is the scenario (the tests run it against an in-process
mesh) and returns the timeline and the derived progress; ``cmd_demo`` is the thin CLI around it.

The package, by concern: plan.py (the WorkItems, their contracts and budgets), cast.py (the
identities), scenario.py (the steps, ``run_demo``), watch.py (following the Group's log),
workers.py (the Workers' scripted handler), timeline.py and result.py (the output), command.py
(the flags and ``cmd_demo``).
"""

from missionweave.cli.demo.command import cmd_demo, register
from missionweave.cli.demo.result import DemoResult
from missionweave.cli.demo.scenario import run_demo

__all__ = ["DemoResult", "cmd_demo", "register", "run_demo"]
