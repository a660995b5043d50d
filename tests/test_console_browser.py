"""Mission control (the web console, docs/console.md) in a real browser against a live mesh: Debian's
Chromium, headless, driven by Playwright; every assertion is on what a person sees in the page.

Each test starts a mesh in this process with its console on a free port (the last one starts
``mwp serve --topology split``), seeds it through the SDK (tests/console_world.py) and signs in
with a key file as a person would. Waits are on the page's own state (Playwright's ``expect``),
never on time. Screenshots of the main pages go to $MWP_TEST_ARTIFACTS (default: the test's tmp
directory). Without /usr/bin/chromium the tests are skipped, except in CI (CI=true), where they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from missionweave.v1 import authority_service_pb2, common_pb2
from missionweave.v1 import work_pb2 as wp
from missionweave_server.services.artifacts.local import LocalBlobStore
from tests.conftest import polled
from tests.console_world import (
    AXE,
    CHROMIUM,
    ROOT,
    WAIT_MS,
    ConsoleMesh,
    MissionSeed,
    Person,
    browser_or_skip,
    console_mesh,
    first_line,
    people,
)
from tests.split_mesh import free_port

with contextlib.suppress(ImportError):  # browser_or_skip() names what is missing (and fails in CI)
    from playwright.async_api import Browser, BrowserContext, Page, expect

# Each test takes seconds; a hang fails it well before the suite's own limit.
pytestmark = pytest.mark.timeout(60)

ALPHA, BOBS = "grp_alpha", "grp_bobs"
TITLE, BOBS_TITLE = "Q3 report", "Bob's acquisition plan"
VERIFIED = "✓ verified"
# app.css: a focused node's outline (every focused control's colour), a critical node's border.
FOCUS_RING, CRITICAL = "rgb(242, 182, 0)", "rgb(163, 22, 27)"


def state_name(state: int) -> str:
    """A WorkItem state as the page writes it (ui.ts workStateName)."""
    return wp.WorkItemState.Name(state).removeprefix("WORK_ITEM_STATE_").lower()  # type: ignore[arg-type]


@dataclasses.dataclass
class Console:
    """The browser, the console's address, where screenshots go, and what went wrong in its pages:
    an uncaught exception, or a console error other than the HTTP refusals a test provokes."""

    browser: Browser
    url: str
    shots: Path
    problems: list[str] = dataclasses.field(default_factory=list)
    # Console errors a test expects (a refused call's HTTP status, a dropped connection), as substrings.
    expected: list[str] = dataclasses.field(default_factory=list)

    async def context(self) -> BrowserContext:
        """A context of its own: its own IndexedDB, so its own signed-in person."""
        context = await self.browser.new_context(viewport={"width": 1400, "height": 1000})
        context.set_default_timeout(WAIT_MS)
        return context

    async def page(self, context: BrowserContext | None = None) -> Page:
        page = await (context or await self.context()).new_page()
        page.on("pageerror", lambda err: self.problems.append(f"uncaught in the page: {err}"))
        page.on("console", lambda msg: self._console(msg.type, msg.text))
        return page

    def _console(self, kind: str, text: str) -> None:
        if kind == "error" and not any(e in text for e in self.expected):
            self.problems.append(f"console error: {text}")

    async def sign_in(self, page: Page, person: Person) -> None:
        """The sign-in form, filled as a person does: their identity and their key file."""
        await page.goto(self.url)
        await page.locator("#identity").fill(person.identity_id)
        await page.locator("#keyfile").set_input_files(person.key_file)
        await page.get_by_role("button", name="Open session").click()
        await expect(page.locator("header.top .who")).to_contain_text(f"Signed in as {person.identity_id}")

    async def shot(self, page: Page, name: str, *, full_page: bool = True) -> None:
        await page.screenshot(path=self.shots / f"{name}.png", full_page=full_page)


async def open_mission(page: Page, group_id: str, title: str, head: int) -> None:
    """From the Missions list: the Mission's link, then its page with all ``head`` events verified."""
    await page.locator(f'a[href="#/mission/{group_id}"]').first.click()
    await expect(page.locator(".mission-head h1")).to_have_text(title)
    await timeline_verified(page, head)


async def timeline_verified(page: Page, head: int) -> None:
    """Every event of the Group's log drawn, and each checked in the page (signature and chain)."""
    await expect(page.locator("ol.timeline li.event")).to_have_count(head)
    await expect(page.locator("ol.timeline li.event .mark.mark-verified")).to_have_count(head)
    await expect(page.locator("section.panel p.sub[role=status]").last).to_have_text(
        f"{head} of {head} events · {head} verified"
    )


async def sequences(page: Page) -> list[int]:
    drawn = await page.locator("ol.timeline li.event").evaluate_all(
        "rows => rows.map(r => r.dataset.sequence)"
    )
    return [int(s) for s in drawn]


AXE_RUN = """async () => {
  const result = await axe.run(document, {resultTypes: ["violations"], elementRef: true});
  return result.violations.map((v) => ({
    id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.map((n) => ({target: n.target.join(" "), dagNode: n.element.matches("svg.dag g.node")})),
  }));
}"""


async def axe_violations(page: Page) -> list[dict[str, Any]]:
    """axe-core's violations on the page as it is now (its source evaluated in the page: evaluate
    is not subject to the page's CSP, which admits only the console's own scripts)."""
    if not await page.evaluate("typeof window.axe !== 'undefined'"):
        await page.evaluate(AXE.read_text())
    violations: list[dict[str, Any]] = await page.evaluate(AXE_RUN)
    return violations


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    chosen = os.environ.get("MWP_TEST_ARTIFACTS")
    directory = Path(chosen) if chosen else tmp_path / "screenshots"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@pytest.fixture
async def mesh(tmp_path: Path) -> AsyncIterator[ConsoleMesh]:
    browser_or_skip()
    async with console_mesh(tmp_path) as world:
        yield world


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    browser_or_skip()
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=str(CHROMIUM))
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def console(mesh: ConsoleMesh, browser: Browser, shots: Path) -> AsyncIterator[Console]:
    """The browser on ``mesh``'s console; after the test, nothing went wrong in its pages."""
    expect.set_options(timeout=WAIT_MS)
    watched = Console(browser, mesh.console_url, shots)
    yield watched
    assert watched.problems == []


# ------------------------------------------------------------------ 1. sign-in and the Missions list


async def test_an_owner_signs_in_with_her_key_file_and_sees_only_the_missions_her_memberships_show(
    mesh: ConsoleMesh, console: Console
) -> None:
    alpha = MissionSeed(mesh, ALPHA, TITLE)
    await alpha.planned()
    bobs = MissionSeed(mesh, BOBS, BOBS_TITLE, owner="bob")
    await bobs.create()
    # Bob's Mission exists and its owner's listing has it: its absence below is alice's view.
    bob = mesh.client("bob")
    assert [m.group_id for m in await bob.missions()] == [BOBS]

    page = await console.page()
    sent: list[bytes] = []
    page.on("request", lambda request: sent.append(request.post_data_buffer or b""))
    await page.goto(console.url)
    await expect(page.get_by_role("heading", name="Sign in to Mission control")).to_be_visible()
    await console.shot(page, "01-sign-in")
    await console.sign_in(page, mesh.people["alice"])

    await expect(page.get_by_role("heading", name="Missions", exact=True)).to_be_visible()
    await expect(page.locator("#active-title")).to_have_text("In progress (1)")
    row = page.locator("table.missions tbody tr")
    await expect(row).to_have_count(1)
    await expect(row.locator("a")).to_have_text(TITLE)
    await expect(row.locator("a")).to_have_attribute("href", f"#/mission/{ALPHA}")
    await expect(row.locator("td").nth(2)).to_contain_text(
        "required"
    )  # progress, as GetMissionProgress derives it
    await expect(row.locator("td").nth(3)).to_have_text("alice (you)")
    await expect(row.locator("td").nth(4)).to_have_text("coord-bot")
    await expect(page.locator("#inbox-title")).to_have_text("Waiting for your approval (0)")
    await expect(page.locator(f'a[href="#/mission/{BOBS}"]')).to_have_count(0)
    assert BOBS_TITLE not in await page.locator("main").inner_text()
    await console.shot(page, "02-missions-list-alice")

    # The key file signed one session opening in the page; its seed never left it.
    seed = mesh.people["alice"].key.encode()
    assert sent and not [body for body in sent if seed in body or seed.hex().encode() in body]


# ------------------------------------------------------------------ 2. a Mission: the DAG and the timeline


async def test_a_mission_page_draws_the_dag_and_a_timeline_whose_every_event_verifies(
    mesh: ConsoleMesh, console: Console
) -> None:
    alpha = MissionSeed(mesh, ALPHA, TITLE)
    await alpha.submitted()
    head = await alpha.head()

    page = await console.page()
    await console.sign_in(page, mesh.people["alice"])
    await open_mission(page, ALPHA, TITLE, head)

    await expect(page.get_by_test_id("mission-state")).to_have_text("awaiting approval")
    nodes = page.locator("svg.dag g.node")
    await expect(nodes).to_have_count(3)
    assert await nodes.evaluate_all("gs => gs.map(g => g.dataset.workItem)") == ["wi-a", "wi-b", "wi-c"]
    await expect(nodes.locator(".node-title")).to_have_text(
        ["Extract the data", "Write the report", "Draw the chart"]
    )
    await expect(nodes.locator(".node-state")).to_have_text(["verified"] * 3)
    # Coloured by state (app.css): verified green, the Mission's state badge amber while it waits.
    for i in range(3):
        await expect(nodes.nth(i).locator("rect")).to_have_css("fill", "rgb(211, 242, 221)")
    await expect(page.get_by_test_id("mission-state")).to_have_css("background-color", "rgb(255, 241, 194)")
    # wi-b and wi-c depend on wi-a: two edges, both from it.
    edges = page.locator("svg.dag path.edge")
    await expect(edges).to_have_count(2)
    assert await edges.evaluate_all("ps => ps.map(p => p.dataset.from + '>' + p.dataset.to)") == [
        "wi-a>wi-b",
        "wi-a>wi-c",
    ]
    # Newest first, every sequence once, each with its type and the Authority's signing key.
    assert await sequences(page) == list(range(head, 0, -1))
    first = page.locator("ol.timeline li.event[data-sequence='1']")
    await expect(first.locator(".etype")).to_have_text("mission.created")
    await expect(first.locator(".summary")).to_have_text(TITLE)
    await expect(first.locator(".signed")).to_contain_text("signed authority:")
    await expect(page.locator("ol.timeline li.event").first.locator(".etype")).to_have_text(
        "mission.submitted"
    )
    await expect(page.locator(".live")).to_have_text("live")
    await console.shot(page, "03-mission-page")


# ------------------------------------------------------------------ 3. live WorkItem state


async def test_a_workitem_changes_state_in_the_open_page_without_a_reload(
    mesh: ConsoleMesh, console: Console
) -> None:
    alpha = MissionSeed(mesh, ALPHA, TITLE)
    await alpha.planned()
    await alpha.offer("wi-a")
    head = await alpha.head()

    page = await console.page()
    await console.sign_in(page, mesh.people["alice"])
    await open_mission(page, ALPHA, TITLE, head)
    node = page.locator("svg.dag g.node[data-work-item='wi-a']")
    await expect(node).to_have_class(re.compile(r"\bcritical\b"))
    await expect(node.locator("rect")).to_have_css("stroke", CRITICAL)
    await node.click()
    await expect(node.locator("rect")).to_have_css("stroke", FOCUS_RING)  # focused, critical or not
    await expect(page.locator("#wi-title")).to_have_text("Extract the data")
    await expect(page.get_by_test_id("wi-state")).to_have_text("offered")
    await page.evaluate("window.__sameDocument = true")

    # The Worker takes the offer, then starts: each change reaches the open page.
    for step, event_type in ((alpha.accept, "work.offer_accepted"), (alpha.start, "work.started")):
        await step("wi-a")
        state = (await alpha.reader.work_item(ALPHA, "wi-a")).state
        shown = state_name(state)
        await expect(page.get_by_test_id("wi-state")).to_have_text(shown)
        await expect(node.locator(".node-state")).to_have_text(f"{shown} · worker-bot")
        name = wp.WorkItemState.Name(state).removeprefix("WORK_ITEM_STATE_")  # protobuf-es's enum name
        await expect(node).to_have_class(re.compile(rf"\bstate-{name}\b"))
        await expect(page.locator(f"ol.timeline li.event[data-type='{event_type}']")).to_have_count(1)
    assert shown == "active"
    # The execution lease it now holds, read when the state changed (GetWorkItem).
    await expect(page.get_by_test_id("wi-lease")).to_contain_text("worker-bot, attempt 1, expires")
    await expect(node.locator("rect")).to_have_css("fill", "rgb(207, 227, 255)")  # app.css: active
    await timeline_verified(page, await alpha.head())
    await expect(page.locator("#wi-title")).to_have_text("Extract the data")  # still the one picked
    assert await page.evaluate("window.__sameDocument === true")  # no reload happened


# ------------------------------------------------------------------ 4. the submission: Artifacts and Evidence


async def test_the_review_shows_each_artifact_verified_and_the_evidence_per_acceptance_criterion(
    mesh: ConsoleMesh, console: Console
) -> None:
    alpha = MissionSeed(mesh, ALPHA, TITLE)
    await alpha.submitted()
    head = await alpha.head()
    report, chart = alpha.refs["report"].digest.hex, alpha.refs["chart"].digest.hex

    page = await console.page()
    await console.sign_in(page, mesh.people["alice"])
    await open_mission(page, ALPHA, TITLE, head)

    review = page.locator("section.review")
    await expect(review).to_contain_text("Submitted by coord-bot")
    await expect(review).to_contain_text("“Q3 report and chart”")
    submitted = review.locator(":scope > div > ul.artifacts > li.artifact")
    await expect(submitted).to_have_count(2)
    assert await submitted.evaluate_all("li => li.map(a => a.dataset.digest)") == [report, chart]
    for row, media in zip(
        (submitted.nth(0), submitted.nth(1)), ("text/markdown", "image/svg+xml"), strict=True
    ):
        await expect(row.get_by_test_id("artifact-verify")).to_contain_text(VERIFIED)
        await expect(row.get_by_test_id("artifact-verify")).to_contain_text("matches its content hash")
        await expect(row).to_contain_text(f"{media} · ")
        await expect(row).to_contain_text("by worker-bot")
        await expect(row.locator("a.download")).to_have_attribute("href", re.compile("^blob:"))
        await expect(row.locator("ul.provenance")).to_contain_text("derived from")  # from wi-a's data

    # Each WorkItem's acceptance criterion with the Evidence against it: the Worker's test and the
    # Coordinator's review; each WorkItem's own Artifacts (its output and its test log) verified too.
    items = review.locator("details.wi-review")
    await expect(items).to_have_count(3)
    for i, title in enumerate(("Extract the data", "Write the report", "Draw the chart")):
        item = items.nth(i)
        await expect(item.locator("summary")).to_contain_text(f"{title} — verified, submitted by worker-bot")
        criteria = item.locator("table.criteria tbody tr")
        await expect(criteria).to_have_count(1)
        cells = criteria.locator("td")
        await expect(cells.nth(0)).to_have_text("all balances match")
        await expect(cells.nth(1)).to_have_text("✓ met")
        await expect(cells.nth(2).locator(".evidence-summary")).to_have_text(
            [
                "pass · test by worker-bot: 42 of 42 balances match",
                "pass · review by coord-bot: read against the ledger",
            ]
        )
        # The Artifact the Worker's test cites (its log) is shown and checked like the submission's.
        cited = cells.nth(2).locator("li.artifact")
        await expect(cited).to_have_count(1)
        await expect(cited.get_by_test_id("artifact-verify")).to_contain_text(VERIFIED)
        own = item.locator("li.artifact")
        await expect(own).not_to_have_count(0)
        await expect(own.get_by_test_id("artifact-verify")).to_contain_text([VERIFIED] * await own.count())
    await page.evaluate("document.querySelectorAll('details.wi-review').forEach(d => { d.open = true; })")
    await console.shot(page, "04-review-artifacts-and-evidence")


# ------------------------------------------------------------------ 5. approve, and a refusal in words


async def test_approving_shows_the_command_before_signing_and_a_second_approval_is_refused_in_words(
    mesh: ConsoleMesh, console: Console
) -> None:
    alpha = MissionSeed(mesh, ALPHA, TITLE)
    submission = await alpha.submitted()
    head = await alpha.head()
    console.expected.append("status of 409")  # the refused approval's HTTP answer

    context = await console.context()
    page = await console.page(context)
    await console.sign_in(page, mesh.people["alice"])
    await open_mission(page, ALPHA, TITLE, head)
    # A second tab of the same browser (the same session, kept in IndexedDB) drafts an approval too.
    other = await console.page(context)
    await other.goto(f"{console.url}#/mission/{ALPHA}")
    await timeline_verified(other, head)
    stale = await draft_approval(other, submission)

    await page.bring_to_front()  # back to the first tab (a background tab draws no frames)
    dialog = await draft_approval(page, submission, comment="figures reconcile")
    shown = await dialog.locator("pre.to-sign").inner_text()
    assert (
        '"missionApprove": {' in shown and f'"groupId": "{ALPHA}"' in shown and '"actorId": "alice"' in shown
    )
    assert '"comment": "figures reconcile"' in shown
    assert shown.startswith(
        "payload type application/vnd.missionweave.v1.command+protobuf\nsigned by alice#session-"
    )
    await expect(dialog.locator("p.outcome")).to_have_text("Check the command above, then sign it.")
    await console.shot(page, "05-approve-dialog", full_page=False)
    await dialog.get_by_role("button", name="Sign and send").click()
    await expect(dialog.locator("p.outcome")).to_have_text(
        re.compile(r"^Done: 1 event\(s\) appended, the Group is at revision \d+\.$")
    )
    await dialog.get_by_role("button", name="Close").click()
    await expect(page.get_by_test_id("mission-state")).to_have_text("approved")
    actions = page.locator("nav.actions")
    await expect(actions.get_by_role("button", name="Create follow-up")).to_be_visible()
    # Approved is terminal: no second approval is offered, nor anything else but a follow-up.
    await expect(actions.get_by_role("button")).to_have_text(["Create follow-up"])
    await expect(page.locator("ol.timeline li.event").first.locator(".etype")).to_have_text(
        "mission.approved"
    )
    await console.shot(page, "06-approved")

    # The other tab's approval, drafted before, is refused by the mesh and says why.
    await other.bring_to_front()
    await expect(other.get_by_test_id("mission-state")).to_have_text("approved")
    await stale.get_by_role("button", name="Sign and send").click()
    outcome = stale.locator("p.outcome")
    await expect(outcome).to_have_class(re.compile(r"\berror\b"))
    await expect(outcome).to_contain_text("Refused — TERMINAL_STATE: mission.approve: the Mission is")
    await expect(outcome).to_contain_text("a terminal state")
    await console.shot(other, "07-second-approval-refused", full_page=False)
    approvals = [e async for e in alpha.reader.read_events(ALPHA) if e.type == "mission.approved"]
    assert len(approvals) == 1 and approvals[0].actor_id == "alice"
    assert approvals[0].mission_approved.comment == "figures reconcile"


async def draft_approval(page: Page, submission: str, comment: str = "") -> Any:
    """The Approve dialog with its Command drafted ("Review what I will sign"), not yet signed."""
    await page.locator("nav.actions").get_by_role("button", name="Approve").click()
    dialog = page.locator("dialog.action[open]")
    await expect(dialog.get_by_role("heading")).to_have_text("Approve the submission")
    await expect(dialog.get_by_role("button", name="Sign and send")).to_be_disabled()
    if comment:
        await dialog.get_by_label("Comment").fill(comment)
    await dialog.get_by_role("button", name="Review what I will sign").click()
    await expect(dialog.locator("pre.to-sign")).to_contain_text(f'"submissionEventId": "{submission}"')
    await expect(dialog.get_by_role("button", name="Sign and send")).to_be_enabled()
    return dialog


# ------------------------------------------------------------------ 6. a non-member


async def test_a_non_member_sees_nothing_of_a_mission_not_even_by_its_address(
    mesh: ConsoleMesh, console: Console
) -> None:
    alpha = MissionSeed(mesh, ALPHA, TITLE)
    await alpha.submitted()
    console.expected.append("status of 403")  # the refused reads' HTTP answer

    page = await console.page()
    await console.sign_in(page, mesh.people["carol"])
    await expect(page.locator("#active-title")).to_have_text("In progress (0)")
    await expect(page.locator("#inbox-title")).to_have_text("Waiting for your approval (0)")
    await expect(page.locator("table.missions")).to_have_count(0)
    assert TITLE not in await page.locator("main").inner_text()
    await console.shot(page, "08-missions-list-non-member")

    await page.goto(f"{console.url}#/mission/{ALPHA}")
    await expect(page.get_by_role("heading", name="Refused")).to_be_visible()
    await expect(page.get_by_role("alert")).to_have_text(
        f"NOT_A_MEMBER: carol holds no active Membership in {ALPHA}"
    )
    assert TITLE not in await page.locator("body").inner_text()
    for shown in ("ol.timeline li.event", "svg.dag", "section.review", "nav.actions"):
        await expect(page.locator(shown)).to_have_count(0)
    await console.shot(page, "09-mission-refused-non-member")


# ------------------------------------------------------------------ 7. a tampered Artifact


async def test_an_artifact_whose_stored_bytes_were_altered_is_shown_failing_verification(
    mesh: ConsoleMesh, console: Console
) -> None:
    alpha = MissionSeed(mesh, ALPHA, TITLE)
    await alpha.submitted()
    head = await alpha.head()
    report, chart = alpha.refs["report"].digest.hex, alpha.refs["chart"].digest.hex
    blob = LocalBlobStore(mesh.data_dir).path_for(chart)  # blobs/ab/cd/<hex> under the data dir
    altered = bytearray(blob.read_bytes())
    altered[len(altered) // 2] ^= 0xFF
    blob.write_bytes(bytes(altered))

    page = await console.page()
    await console.sign_in(page, mesh.people["alice"])
    await open_mission(page, ALPHA, TITLE, head)
    submitted = page.locator("section.review > div > ul.artifacts > li.artifact")
    await expect(submitted).to_have_count(2)
    tampered = page.locator(f"li.artifact[data-digest='{chart}']")
    await expect(tampered).to_have_count(2)  # in the submission and under wi-c
    for i in range(2):
        status = tampered.nth(i).get_by_test_id("artifact-verify")
        await expect(status).to_contain_text("✗ FAILED verification")
        await expect(status).to_contain_text("DATA_CORRUPTED")
        await expect(status).to_have_class(re.compile(r"\berror\b"))
        await expect(tampered.nth(i).locator("a.download")).not_to_have_attribute("href", re.compile("."))
    intact = page.locator(f"li.artifact[data-digest='{report}']").first
    await expect(intact.get_by_test_id("artifact-verify")).to_contain_text(VERIFIED)
    await tampered.first.scroll_into_view_if_needed()
    await console.shot(page, "10-tampered-artifact", full_page=False)


# ------------------------------------------------------------------ 8. a dropped stream resumes


async def test_after_a_dropped_stream_the_page_resumes_from_its_cursor_and_shows_each_event_once(
    mesh: ConsoleMesh, console: Console
) -> None:
    from missionweave_server.mesh.console import start_console

    alpha = MissionSeed(mesh, ALPHA, TITLE)
    await alpha.planned()
    head = await alpha.head()
    # While the console is away the page's calls fail to connect or are cut short: expected here.
    console.expected += ["net::ERR_", "status of 503"]

    page = await console.page()
    await console.sign_in(page, mesh.people["alice"])
    await open_mission(page, ALPHA, TITLE, head)
    await expect(page.locator(".live")).to_have_text("live")

    # The console goes away: the page's stream drops and it says so.
    old = mesh.mesh.console
    await old.stop()
    await expect(page.locator(".live")).to_have_text(f"disconnected; retrying from #{head}")
    # Meanwhile the Mission goes on.
    posted = [f"while the console was away ({i})" for i in range(3)]
    for text in posted:
        await alpha.post(text)
    await alpha.offer("wi-a")
    now = await alpha.head()
    assert now == head + 4
    # The console comes back on its address; the page resumes after the last sequence it read.
    settings = dataclasses.replace(mesh.mesh.settings, console_listen=f"127.0.0.1:{old.port}")
    mesh.mesh.console = await start_console(settings, mesh.mesh.port, None, None)

    await timeline_verified(page, now)
    assert await sequences(page) == list(range(now, 0, -1))  # each once, none skipped
    await expect(page.locator(".live")).to_have_text(f"live (resumed after #{head})")
    messages = page.locator("ol.timeline li.event[data-type='message.posted'] .summary")
    await expect(messages).to_have_text(list(reversed(posted)))
    await page.locator("svg.dag g.node[data-work-item='wi-a']").click()
    await expect(page.get_by_test_id("wi-state")).to_have_text("offered")  # the folded views caught up too


# ------------------------------------------------------------------ 8b. a page left ends its stream


async def test_a_mission_page_left_ends_its_relayed_mesh_stream_at_once(
    mesh: ConsoleMesh, console: Console, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page follows its Group through the relay; leaving the page aborts that call, and the
    console ends the mesh stream behind it then, not at the Group's next event (a quiet Group's
    follow would otherwise outlive the tab)."""
    from missionweave_server.console import relay

    follows: list[Any] = []
    relayed = relay.Relay.stream

    def recorded(self: relay.Relay, method: str, request: bytes, call_proof: bytes | None) -> Any:
        call = relayed(self, method, request, call_proof)
        # The follows only (the Missions list reads an owner's past decisions without following).
        if (
            method.endswith("/ReadEvents")
            and authority_service_pb2.ReadEventsRequest.FromString(request).follow
        ):
            follows.append(call)
        return call

    monkeypatch.setattr(relay.Relay, "stream", recorded)
    alpha = MissionSeed(mesh, ALPHA, TITLE)
    await alpha.planned()
    page = await console.page()
    await console.sign_in(page, mesh.people["alice"])
    await open_mission(page, ALPHA, TITLE, await alpha.head())
    await expect(page.locator(".live")).to_have_text("live")
    assert len(follows) == 1 and not follows[0].done()

    await page.get_by_role("navigation", name="Main").get_by_role("link", name="Missions").click()
    await expect(page.locator("#active-title")).to_have_text("In progress (1)")

    async def ended() -> bool:
        return bool(follows[0].done())

    await polled(ended, limit_s=WAIT_MS / 1000)  # nothing signals it: the call is asked
    assert follows[0].cancelled() and len(follows) == 1


# ------------------------------------------------------------------ 9. keyboard and accessibility


async def test_the_dag_works_from_the_keyboard_and_axe_finds_no_violations(
    mesh: ConsoleMesh, console: Console
) -> None:
    alpha = MissionSeed(mesh, ALPHA, TITLE)
    submission = await alpha.submitted()
    head = await alpha.head()

    page = await console.page()
    await page.goto(console.url)
    await expect(page.locator("#identity")).to_be_visible()
    assert await axe_violations(page) == [], "the sign-in page"
    await console.sign_in(page, mesh.people["alice"])
    await expect(page.locator("table.missions")).to_have_count(1)  # the inbox (each Mission is listed once)
    assert await axe_violations(page) == [], "the Missions list"
    await open_mission(page, ALPHA, TITLE, head)
    await expect(page.locator("section.review [data-testid=artifact-verify].ok")).not_to_have_count(0)
    assert await axe_violations(page) == [], "the Mission page"

    # Tab from the top of the page to the first node of the graph; Enter picks it.
    await page.locator("body").focus()
    focused = ""
    for _ in range(40):
        await page.keyboard.press("Tab")
        focused = await page.evaluate("document.activeElement?.closest('g.node')?.dataset.workItem ?? ''")
        if focused:
            break
    assert focused == "wi-a", "Tab never reached the graph"
    await expect(page.locator("svg.dag g.node[data-work-item='wi-a'] rect")).to_have_css("stroke", FOCUS_RING)
    await page.keyboard.press("Enter")
    await expect(page.locator("#wi-title")).to_have_text("Extract the data")
    await expect(page.get_by_test_id("wi-state")).to_have_text("verified")
    await page.keyboard.press("Tab")
    assert await page.evaluate("document.activeElement?.closest('g.node')?.dataset.workItem") == "wi-b"
    await page.keyboard.press(" ")
    await expect(page.locator("#wi-title")).to_have_text("Write the report")
    await expect(page.locator("section.workitem dd").nth(2)).to_have_text("wi-a")  # depends on

    dialog = await draft_approval(page, submission)
    assert await axe_violations(page) == [], "the approve dialog"
    await dialog.get_by_role("button", name="Close").click()


# ------------------------------------------------------------------ 10. the split topology


async def test_the_split_topology_serves_the_console_from_its_gateway(tmp_path: Path, shots: Path) -> None:
    """`mwp serve --topology split` with MWP_CONSOLE_LISTEN: the gateway's process serves the
    console, which relays to the front door; sign in, list, open a Mission."""
    browser_or_skip()
    from playwright.async_api import async_playwright

    port, console_port = free_port(), free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MWP_")},
        "PYTHONPATH": str(ROOT),
        "MWP_VERIFY_WORKERS": "0",
        "MWP_METRICS_LISTEN": "",
        "MWP_CONSOLE_LISTEN": f"127.0.0.1:{console_port}",
    }
    launcher = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "missionweave.cli",
        "serve",
        "--topology",
        "split",
        "--listen",
        f"127.0.0.1:{port}",
        "--data-dir",
        str(tmp_path / "data"),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=ROOT,
        start_new_session=True,  # its own process group: a Ctrl-C to pytest is not delivered to it
    )
    drain: asyncio.Task[None] | None = None
    world = ConsoleMesh(None, f"127.0.0.1:{port}", f"http://127.0.0.1:{console_port}/", tmp_path / "data")
    try:
        assert launcher.stderr is not None
        await first_line(launcher.stderr, "split topology serving", f'"url": "{world.console_url}"')
        drain = asyncio.create_task(drained(launcher.stderr))  # its children log on: never let the pipe fill
        await people(world, tmp_path / "data" / "keys" / "admin.key", tmp_path / "keys")
        alpha = MissionSeed(world, ALPHA, TITLE)
        await alpha.planned()
        await alpha.worked("wi-a", "data", b"region,q3\nnorth,120\n", "text/csv")
        await MissionSeed(world, BOBS, BOBS_TITLE, owner="bob").create()
        head = await alpha.head()

        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=str(CHROMIUM))
            try:
                expect.set_options(timeout=WAIT_MS)
                console = Console(browser, world.console_url, shots)
                page = await console.page()
                await console.sign_in(page, world.people["alice"])
                rows = page.locator("table.missions tbody tr a")
                await expect(rows).to_have_text([TITLE])
                await open_mission(page, ALPHA, TITLE, head)
                await expect(page.locator("svg.dag g.node")).to_have_count(3)
                await expect(page.locator("svg.dag g.node .node-state")).to_have_text(
                    ["verified", "open", "open"]
                )
                # wi-b's criterion has no Evidence yet, and the review says so in words.
                criterion = page.locator("details.wi-review").nth(1).locator("table.criteria tbody td")
                await expect(criterion.nth(1)).to_have_text("✗ no evidence yet")
                await expect(page.locator("li.artifact [data-testid=artifact-verify]").first).to_contain_text(
                    VERIFIED
                )
                await console.shot(page, "11-split-topology-mission-page")
                assert console.problems == []
            finally:
                await browser.close()
    finally:
        await world.close()
        if launcher.returncode is None:
            launcher.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(launcher.wait(), 30)
            except TimeoutError:
                os.killpg(launcher.pid, signal.SIGKILL)
                await launcher.wait()
        if drain is not None:
            await drain
    assert launcher.returncode == 0


async def drained(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass


# ------------------------------------------------------------------ 10. large Missions


async def test_above_fifty_workitems_each_review_and_conversation_section_is_built_when_opened(
    mesh: ConsoleMesh, console: Console, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Mission of many WorkItems lists each one's review and Conversation closed and builds its
    content (criteria, Evidence, Artifacts and their downloads; messages) when it is first opened."""
    from tests import console_world

    budget = common_pb2.ResourceVector()
    budget.CopyFrom(console_world.BUDGET)
    budget.side_effects, budget.financial_micros, budget.tokens = 200, 500_000_000, 10_000_000
    budget.tool_calls, budget.compute_ms, budget.wall_clock_ms = 5_000, 60_000_000, 600_000_000
    monkeypatch.setattr(console_world, "BUDGET", budget)  # room for 51 WorkItems' caps
    alpha = MissionSeed(mesh, ALPHA, TITLE)
    await alpha.create(mesh.people["worker-bot"].signer.identity_id)
    many = 51
    for i in range(many):
        await alpha.authorize(f"wi-{i:02d}", f"Step {i}")
    page = await console.page()
    await console.sign_in(page, mesh.people["alice"])
    await open_mission(page, ALPHA, TITLE, await alpha.head())

    review = page.locator("section.review")
    await review.scroll_into_view_if_needed()
    sections = review.locator("details.wi-review")
    await expect(sections).to_have_count(many)
    await expect(review.locator("table.criteria")).to_have_count(0)
    await sections.first.locator("summary").click()
    await expect(sections.first.locator("table.criteria")).to_have_count(1)
    await expect(review.locator("table.criteria")).to_have_count(1)

    conversations = page.locator("section.conversations")
    await conversations.scroll_into_view_if_needed()
    work = conversations.locator("details.conversation")
    await expect(work).to_have_count(many + 1)  # the planning Conversation and one per WorkItem
    await expect(conversations.locator("ol.messages")).to_have_count(0)
    await work.nth(1).locator("summary").click()
    await expect(work.nth(1).locator("ol.messages")).to_have_count(1)
