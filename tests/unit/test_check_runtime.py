"""tools/check_runtime.py's parse step under a release venv's interpreter (`_parse-argv IN OUT`), on a stand-in vllm
package: the argvs are parsed by the parser tools/release_facts.py builds, with the CUDA platform stand-in where the
release cannot build its parser without a GPU (0.9.x)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A vllm whose parser, like v0.9.2's (vllm/config.py:2407-2416), cannot be built while no platform has a device type.
FAKE_VLLM = {
    "vllm/__init__.py": "",
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/openai/__init__.py": "",
    "vllm/utils.py": "import argparse\nclass FlexibleArgumentParser(argparse.ArgumentParser):\n    pass\n",
    "vllm/platforms/__init__.py": "_current_platform = None\n",
    "vllm/platforms/interface.py": (
        "import enum\nclass PlatformEnum(enum.Enum):\n    CUDA = 1\nclass Platform:\n    device_type = ''\n"),
    "vllm/entrypoints/openai/cli_args.py": (
        "import vllm.platforms as platforms\n"
        "def make_arg_parser(parser):\n"
        "    if getattr(platforms._current_platform, 'device_type', '') != 'cuda':\n"
        "        raise RuntimeError('Failed to infer device type, please set the environment variable')\n"
        "    parser.add_argument('--port', type=int, default=8000)\n"
        "    return parser\n"
        "def validate_parsed_serve_args(args):\n"
        "    if args.port == 1:\n"
        "        raise TypeError('port 1 is reserved')\n"),
}


def test_parse_step_uses_the_stand_in_and_reports_each_argv(tmp_path):
    for name, text in FAKE_VLLM.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    cases = [{"label": "ok", "argv": ["--port", "8001"]}, {"label": "bad type", "argv": ["--port", "x"]},
             {"label": "unknown", "argv": ["--swap-space", "4"]}, {"label": "validated", "argv": ["--port", "1"]}]
    source, out = tmp_path / "argv.json", tmp_path / "result.json"
    source.write_text(json.dumps(cases))
    subprocess.run([sys.executable, str(REPO / "tools" / "check_runtime.py"), "_parse-argv", str(source), str(out)],
                   env=dict(os.environ, PYTHONPATH=str(tmp_path)), cwd=str(tmp_path), check=True, timeout=60)
    verdicts = {r["label"]: r["error"] for r in json.loads(out.read_text())}
    assert verdicts["ok"] is None
    assert verdicts["bad type"].startswith("exit 2: ") and "invalid int value: 'x'" in verdicts["bad type"]
    assert "unrecognized arguments: --swap-space 4" in verdicts["unknown"]
    assert verdicts["validated"] == "TypeError: port 1 is reserved"
