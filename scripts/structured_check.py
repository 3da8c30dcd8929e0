#!/usr/bin/env python3
"""Does every constrained answer parse and validate against its schema, and is it constrained target-only
decoding's? Through the CLI, as a script would run it:

    python scripts/structured_check.py --prompts scripts/structured.jsonl -n 400 -- -t 2

Each line of the prompt file (a bench prompt file: "prompt", "schema") becomes a chat request with
`response_format: json_schema`; one `specdec batch` answers them all per drafter (`--drafters`, default
none and auto; the lookup cache off). Every answer is checked with the `jsonschema`
package (an independent validator; `pip install jsonschema`, not a dependency of specdec), and every
drafter's text against `none`'s. Prints a line per schema and the totals; exits 1 when an answer that
finished is invalid or a text differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import jsonschema

SPECDEC = [sys.executable, "-m", "specdec_cli"]


def requests(prompts: list[dict], max_tokens: int) -> list[dict]:
    return [
        {"custom_id": f"{i}-{p.get('category', 'schema')}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "specdec", "messages": [{"role": "user", "content": p["prompt"]}], "max_tokens": max_tokens,
                  "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": p["schema"]}}}}
        for i, p in enumerate(prompts)
    ]  # fmt: skip


def answers(lines: list[dict], drafter: str, args: list[str]) -> dict[str, tuple[str, str]]:
    """custom_id -> (text, finish_reason) from one `specdec batch` run."""
    with tempfile.TemporaryDirectory() as tmp:
        req, out = Path(tmp) / "requests.jsonl", Path(tmp) / "results.jsonl"
        req.write_text("".join(json.dumps(x) + "\n" for x in lines))
        env = {k: v for k, v in os.environ.items() if k != "SPECDEC_DEBUG"}
        # No lookup cache: no drafter sees an answer written before (another drafter's, another run's).
        subprocess.run([*SPECDEC, "batch", str(req), "-o", str(out), "--drafter", drafter, "--no-lookup-cache",
                        *args], env=env, check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        got = {}
        for line in out.read_text().splitlines():
            r = json.loads(line)
            choice = r["response"]["body"]["choices"][0]
            got[r["custom_id"]] = (choice["message"]["content"], choice["finish_reason"])
        return got


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=Path, default=Path(__file__).with_name("structured.jsonl"))
    parser.add_argument("-n", "--max-tokens", type=int, default=400)
    parser.add_argument("--drafters", default="none,auto")
    parser.add_argument("rest", nargs="*", help="after --: options for specdec batch (models, threads, --exact)")
    a = parser.parse_args()
    prompts = [json.loads(line) for line in a.prompts.read_text().splitlines() if line.strip()]
    lines = requests(prompts, a.max_tokens)
    drafters = a.drafters.split(",")
    runs = {d: answers(lines, d, a.rest) for d in drafters}
    base = runs[drafters[0]]
    valid = finished = same = 0
    for line, p in zip(lines, prompts):
        cid = line["custom_id"]
        text, reason = base[cid]
        ok = "cut at -n"
        if reason == "stop":
            finished += 1
            try:
                jsonschema.validate(json.loads(text), p["schema"])
                ok, valid = "valid", valid + 1
            except (ValueError, jsonschema.ValidationError) as e:
                ok = f"INVALID: {str(e).splitlines()[0][:80]}"
        agree = all(runs[d][cid][0] == text for d in drafters)
        same += agree
        print(f"{cid:24} {len(text):5} chars  {ok:10}  {'identical' if agree else 'DIFFERS'} across {a.drafters}")
    print(f"valid {valid}/{finished} finished answers ({len(lines)} schemas); identical {same}/{len(lines)}")
    return 0 if valid == finished and same == len(lines) else 1


if __name__ == "__main__":
    sys.exit(main())
