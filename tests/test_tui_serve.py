"""A serve stage in the console: its server's state in the stages table and its live
figures in the Progress pane. Real supervisor and processes; the server is the fake
launch_server (tests/fake_launch_server.py) serving the SGLang test double."""

from __future__ import annotations

from eagle3_console.kernel import config as cfg
from eagle3_console import runs
from eagle3_console.kernel.workspace import Workspace
from tests.test_serve_e2e import free_port, pipeline
from tests.test_tui_helpers import make_app, pane_text, run, wait_until


def test_serve_state_in_the_table_and_figures_in_the_progress_pane(tmp_path):
    # The server loads until `loaded`, touched once the table said loading (no 3 s window to sample).
    loaded = tmp_path / "loaded"
    (tmp_path / "eagle3.toml").write_text(pipeline(free_port(), env=f', FAKE_SGLANG_LOAD_UNTIL = "{loaded}"'))
    ws = Workspace.at(tmp_path)
    runs.launch(ws, cfg.load(ws.config_path), "serve")
    seen: set[str] = set()

    async def main():
        app = make_app(tmp_path, refresh_s=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            table = app.query_one("#stages")

            def status_cell() -> str:
                if app.main_screen.snapshot is None or "serve" not in [s.name for s in app.main_screen.snapshot.stages]:
                    return ""
                value = str(table.get_row("serve")[table.columns_shown.index("status")])
                seen.add(value)
                if value == "loading":
                    loaded.touch()
                return value
            await wait_until(pilot, lambda: status_cell() == "ready")
            assert "loading" in seen
            await wait_until(pilot, lambda: "server ready http://127.0.0.1:" in pane_text(app, "progress"))
            text = pane_text(app, "progress")
            assert "ready after" in text and "running 0, queued 0" in text and "KV 0%" in text
    try:
        run(main())
    finally:
        runs.stop(ws, "serve", grace_s=5)
