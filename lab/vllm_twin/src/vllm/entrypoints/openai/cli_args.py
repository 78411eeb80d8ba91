"""Front-end arguments of vLLM 0.5.4's OpenAI server (as v0.5.4:vllm/entrypoints/openai/cli_args.py builds them).

`build_parser` gives the parser of the release the twin was built for: this hand-written one for 0.5.4,
the one made from the release's CLI table (vllm/_twin/cli_table.py) for 0.8.5.post1.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from vllm.engine.arg_utils import AsyncEngineArgs, nullable_str
from vllm.utils import FlexibleArgumentParser

CERT_NONE = 0  # ssl.CERT_NONE, the default of --ssl-cert-reqs


@dataclass
class LoRAModulePath:
    name: str
    path: str


@dataclass
class PromptAdapterPath:
    name: str
    local_path: str


class LoRAParserAction(argparse.Action):
    """`--lora-modules name=path ...`."""

    def __call__(self, parser, namespace, values, option_string=None):
        modules = []
        for item in values:
            name, path = item.split("=")
            modules.append(LoRAModulePath(name, path))
        setattr(namespace, self.dest, modules)


class PromptAdapterParserAction(argparse.Action):
    """`--prompt-adapters name=path ...`."""

    def __call__(self, parser, namespace, values, option_string=None):
        adapters = []
        for item in values:
            name, path = item.split("=")
            adapters.append(PromptAdapterPath(name, path))
        setattr(namespace, self.dest, adapters)


def make_arg_parser(parser: FlexibleArgumentParser) -> FlexibleArgumentParser:
    add = parser.add_argument
    add("--host", type=nullable_str, default=None, help="host name")
    add("--port", type=int, default=8000, help="port number")
    add("--uvicorn-log-level", type=str, default="info",
        choices=["debug", "info", "warning", "error", "critical", "trace"], help="log level for uvicorn")
    add("--allow-credentials", action="store_true", help="allow credentials")
    add("--allowed-origins", type=json.loads, default=["*"], help="allowed origins")
    add("--allowed-methods", type=json.loads, default=["*"], help="allowed methods")
    add("--allowed-headers", type=json.loads, default=["*"], help="allowed headers")
    add("--api-key", type=nullable_str, default=None,
        help="If provided, the server requires this key in the Authorization header.")
    add("--lora-modules", type=nullable_str, default=None, nargs="+", action=LoRAParserAction,
        help="LoRA module configurations as name=path.")
    add("--prompt-adapters", type=nullable_str, default=None, nargs="+", action=PromptAdapterParserAction,
        help="Prompt adapter configurations as name=path.")
    add("--chat-template", type=nullable_str, default=None, help="Chat template file or single-line template.")
    add("--response-role", type=nullable_str, default="assistant",
        help="Role name returned if request.add_generation_prompt=true.")
    add("--ssl-keyfile", type=nullable_str, default=None, help="SSL key file.")
    add("--ssl-certfile", type=nullable_str, default=None, help="SSL certificate file.")
    add("--ssl-ca-certs", type=nullable_str, default=None, help="CA certificates file.")
    add("--ssl-cert-reqs", type=int, default=CERT_NONE, help="Whether a client certificate is required.")
    add("--root-path", type=nullable_str, default=None, help="FastAPI root_path behind a path-based proxy.")
    add("--middleware", type=nullable_str, action="append", default=[], help="Additional ASGI middleware.")
    add("--return-tokens-as-token-ids", action="store_true",
        help="Represent single tokens as 'token_id:{token_id}' in logprobs.")
    add("--disable-frontend-multiprocessing", action="store_true",
        help="Run the OpenAI front end in the same process as the model serving engine.")
    parser = AsyncEngineArgs.add_cli_args(parser)
    add("--max-log-len", type=int, default=None, help="Max number of prompt characters or ids printed in log.")
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The parser `python -m vllm.entrypoints.openai.api_server` uses (api_server.py:362-368 in 0.5.4)."""
    from vllm._twin.release import current
    release = current()
    if release.behaviour.parser == "table":
        from vllm._twin.cli_table import build_parser as table_parser
        return table_parser(release.arguments)
    return make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))
