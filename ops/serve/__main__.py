"""python -m ops.serve: lint, check the argv with SGLang's own parser, then exec the server.

The program replaces itself with `python -m sglang.launch_server ...`
(os.execv): the supervisor's pid, process group and log stay the server's,
so `stop`, `kill-workers` and the GPU owner mapping see SGLang's scheduler
and TP workers as this run's children.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ops.serve import command
from ops.common import BadInput, run_main
from ops.params import build_parser as spec_parser
from ops.serve.spec import SPEC


def build_parser() -> argparse.ArgumentParser:
    return spec_parser(SPEC, description=__doc__.splitlines()[0], target_required=False,
                       target_help="the [target] path: the model when --model-path is not given")


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def visible_gpus() -> list[int] | None:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return None
    return [int(g) for g in env.split(",") if g.strip().lstrip("-").isdigit()]


def port_in_use(host: str, port: int) -> bool:
    """Whether a listener already holds host:port. SO_REUSEADDR as uvicorn binds, so a
    connection of an earlier server left in TIME_WAIT does not count."""
    import socket

    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except OSError:
        return False        # SGLang reports a host it cannot resolve itself
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def check_with_sglang(server_args: list[str]) -> str:
    """Parse with the installed SGLang exactly as launch_server does (prepare_server_args
    minus the config-file merge); raises SystemExit on a flag it refuses."""
    import argparse as _argparse

    import sglang
    from sglang.srt.server_args import ServerArgs

    parser = _argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    ServerArgs.from_cli_args(parser.parse_args(server_args))
    return sglang.__version__


def main(argv=None) -> int:
    """The program's exit code: bad input is 2 with its `serve: error:` line (ops/common.run_main)."""
    return run_main(_main, argv, prog="serve")


def _main(argv=None) -> int:
    args = parse_args(argv)
    p = vars(args)
    model = args.model_path or args.target
    try:
        lints = command.lint(p, model, visible_gpus())
        server = command.server_argv(p, model or "")
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    for x in lints:
        print(f"serve: lint {x}", flush=True)
    if command.errors(lints) and args.force:
        print(f"serve: --force: starting despite {len(command.errors(lints))} lint error(s)", flush=True)
    elif command.errors(lints):
        raise BadInput(f"refused: {len(command.errors(lints))} lint error(s) above")
    if args.launcher == command.SGLANG_LAUNCHER:
        try:
            version = check_with_sglang(server)
        except ImportError as exc:
            raise BadInput(f"sglang is not importable here ({exc}); pip install sglang=={command.PINNED_SGLANG}")
        except SystemExit:
            raise BadInput("refused: SGLang's own parser rejected the argv (its message is above)") from None
        if version != command.PINNED_SGLANG:
            print(f"serve: lint warning: sglang {version} installed; flags were checked against "
                  f"{command.PINNED_SGLANG}", flush=True)
        print(f"serve: argv accepted by sglang {version}'s ServerArgs parser", flush=True)
    host, port = args.host or "127.0.0.1", int(args.port or 30000)
    if port and port_in_use(host, port):
        # SGLang binds it only after the weights loaded, then dies on it; meanwhile the
        # console would read the other server's /ready as this stage's.
        raise BadInput(f"port {port} on {host} is in use (another server?): stop it or choose another port")
    full = [sys.executable, "-m", args.launcher] + server
    print("serve: exec " + json.dumps(full), flush=True)
    os.execv(sys.executable, full)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
