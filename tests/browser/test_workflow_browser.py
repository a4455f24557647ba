"""A workflow's page in real headless Chromium: reached from the navigation, each step drawn in
its status colour, and the colour follows a step that succeeds."""

from __future__ import annotations

from tests.admin.test_workflows import submit, succeed_all
from tests.browser.conftest import sign_in

# The console's status colours (tidemq.css: --new, --success, --waiting) as Chromium computes them.
NEW, SUCCESS, WAITING = "rgb(36, 85, 195)", "rgb(31, 138, 76)", "rgb(125, 135, 153)"


def _fill(page, id):
    return page.eval_on_selector(f"#node-{id} rect", "rect => getComputedStyle(rect).fill")


def test_a_workflow_page_draws_each_step_and_its_colour_follows_a_success(console, page, shots):
    storage = console.extensions["tidemq"].storage
    a, b, c = submit(storage, "wf.browser", (), (0,), (0,))
    sign_in(page, console.base_url)
    page.click("#nav-workflows")
    page.wait_for_selector("table#workflows")
    page.click(f'a[href="/workflows/{a}"]')
    page.wait_for_selector("svg.dag")
    assert page.locator("svg.dag a.node").count() == 3
    assert page.locator("svg.dag path.edge").count() == 2
    assert (_fill(page, a), _fill(page, b), _fill(page, c)) == (NEW, WAITING, WAITING)
    label = page.text_content(f"#node-{b}")
    assert str(b) in label and "wf.browser" in label
    box_a, box_b = page.locator(f"#node-{a} rect").bounding_box(), page.locator(f"#node-{b} rect").bounding_box()
    assert box_b["x"] > box_a["x"] + box_a["width"]  # a step is drawn right of what it waits on

    assert succeed_all(storage, "wf.browser") == [a]
    page.reload()
    page.wait_for_selector("svg.dag")
    assert (_fill(page, a), _fill(page, b), _fill(page, c)) == (SUCCESS, NEW, NEW)
    shots(page, "workflow")
    page.click(f"#node-{b}")  # each step links to its message, which links back
    page.wait_for_selector("pre#data")
    assert page.url.endswith(f"/messages/{b}")
    page.click("a#workflow")
    page.wait_for_selector("svg.dag")
    assert page.url.endswith(f"/workflows/{a}")
