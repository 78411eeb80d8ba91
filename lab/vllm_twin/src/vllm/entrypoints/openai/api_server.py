"""vLLM 0.5.4's OpenAI-compatible server entry point, as the twin implements it.

`python -m vllm.entrypoints.openai.api_server --model ... ` parses 0.5.4's command line and runs the
simulation (vllm._twin.server); see lab/vllm_twin/README.md.
"""
import sys

from vllm._twin.server import main

if __name__ == "__main__":
    sys.exit(main())
