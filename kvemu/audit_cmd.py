"""``kvemu audit REQUESTS.jsonl``: a prompt-cache audit of a request log, as a table or as JSON."""

from __future__ import annotations

import argparse
import json
import textwrap

from loadgen.audit import ASSUMPTION, DEFAULT_MODE, KINDS, MODE_NAMES, MODES, Audit, Cause, Pair, audit_log
from loadgen.request_log import SAMPLE_LOG


def _paragraphs(*texts: str) -> str:
    return "\n\n".join(t if t.startswith("  ") else textwrap.fill(t, 100) for t in texts)


EPILOG = _paragraphs(
    "The log: one OpenAI chat-completions body (messages) or completions body (prompt) a line, as an application"
    ' logs them, or {"timestamp": SECONDS or ISO 8601, "session": ID, "headers": {...}, "body": {...}}. The session'
    " is the record's session, else an X-Session-Id header, else the body's metadata.session_id, else its user;"
    " where none is given it is inferred: chat requests with the same first user message are one session, and"
    " session-less completions are one. Each prompt is rendered with the emulated server's chat template (tools"
    " first, then the messages), so positions are the server's tokens.",
    f"Cache model: {ASSUMPTION}. A later request caches, of the tokens it shares with the previous prompt (common):",
    "  blocks-B  (vLLM) min(common, previous prompt's length) // B * B: whole blocks only\n"
    "  radix-P   (SGLang) common // P * P: whole pages of the radix tree\n"
    "  for B = 16, 1024 (commercial APIs cache nothing under 1,024 tokens) and P = 1, 16",
    "Token hit ratio = sum of cached tokens / sum of prompt tokens over every request (a session's first request"
    f" counts its tokens, cached 0). The headline (token_hit_ratio) is {DEFAULT_MODE}, vLLM's default block size,"
    " unless --mode says otherwise.",
    "Where a pair parts (position: the 0-based index of the first token that differs) the cause is one of:",
    "\n".join(f"  {k}: {v}" for k, v in KINDS.items()),
    "If moved: each request rendered again with what varies after what does not, in the sessions where it varied:"
    " the tools in one canonical order (keys sorted) where their text changed; volatile values cut from the part"
    " where they parted a pair and appended after the last message; reordered JSON in a message with its keys"
    " sorted; a changed system prompt's varying words appended after the last message. The ratio is then"
    " recomputed from those token sequences.",
    f"Try it on the shipped sample: kvemu audit {SAMPLE_LOG}",
)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("log", metavar="REQUESTS.jsonl",
                        help=f"request log, JSON lines (.gz read as such); {SAMPLE_LOG}: the shipped sample")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--mode", default=DEFAULT_MODE, choices=MODE_NAMES,
                        help=f"the headline mode (default {DEFAULT_MODE}); every mode is reported")
    parser.add_argument("--pairs", type=_count, default=50, metavar="N",
                        help="show at most N pairs, by session then line (default 50; 0: all)")


def _cells(values: tuple[int, ...], width: int = 12) -> str:
    return "".join(f"{v:>{width},}" for v in values)


def _summary(a: Audit) -> list[str]:
    lines = [
        f"log              {a.log}",
        f"requests         {a.requests:,} ({a.chat_requests:,} chat, {a.requests - a.chat_requests:,} completions)",
        f"sessions         {a.sessions_given + a.sessions_inferred:,} ({a.sessions_given:,} given,"
        f" {a.sessions_inferred:,} inferred)",
        f"prompt tokens    {a.prompt_tokens:,} ({a.prompt_tokens_if_moved:,} if moved)",
        textwrap.fill(f"cache model      {ASSUMPTION}", 100, subsequent_indent=" " * 17),
        "",
        f"  {'mode':<14}{'cached':>12}{'hit ratio':>12}{'if moved':>12}",
    ]
    for i, m in enumerate(MODES):
        mark = " *" if m.name == a.default_mode else ""
        lines.append(f"  {m.name + mark:<14}{a.cached[i]:>12,}{a.ratio(m.name):>12.3f}{a.ratio(m.name, True):>12.3f}")
    why = ", vLLM's default block size" if a.default_mode == DEFAULT_MODE else ""
    lines.append(f"  * token_hit_ratio: {a.default_mode}{why} (modes: kvemu audit --help)")
    return lines


def _requests(lines: list[int], limit: int = 8) -> str:
    text = ", ".join(map(str, lines[:limit]))
    return text + (f" (+{len(lines) - limit} more)" if len(lines) > limit else "")


def _causes(causes: list[Cause]) -> list[str]:
    if not causes:
        return ["", "  no pair parts: every request extends its session's previous prompt"]
    lines = ["", "  causes: where consecutive requests of a session part (position: first differing token, 0-based)",
             f"  {'kind':<23}{'position':>9}  {'part':<22}{'pairs':>6}{'tokens lost':>13}  requests (lines)"]
    for c in causes:
        lines.append(f"  {c.kind:<23}{c.position:>9,}  {c.part:<22}{len(c.requests):>6,}{c.tokens_lost:>13,}"
                     f"  {_requests(c.requests)}")
    lines += [f"    {k}: {KINDS[k]}" for k in dict.fromkeys(c.kind for c in causes)]
    return lines


def _pairs(pairs: list[Pair], total: int) -> list[str]:
    if not pairs:
        return [] if total else ["", "  no pairs: every session has one request"]
    heads = "".join(f"{m:>12}" for m in MODE_NAMES)
    lines = ["", f"  pairs (cached tokens per mode){'' if len(pairs) == total else f': {len(pairs)} of {total}, --pairs N'}",
             f"  {'session':<16}{'lines':>12}{'tokens':>14}{heads}{'position':>10}  cause"]
    for p in pairs:
        where = f" in {p.part}" if p.part else ""
        lines.append(f"  {p.session[:16]:<16}{f'{p.previous_line} -> {p.line}':>12}"
                     f"{f'{p.previous_tokens:,} -> {p.tokens:,}':>14}{_cells(p.cached)}"
                     f"{'-' if p.position is None else f'{p.position:,}':>10}  {p.kind}{where}")
        if p.position is not None:
            lines += [f"  {'':<16}{'previous':>12}  {p.excerpt_previous}", f"  {'':<16}{'current':>12}  {p.excerpt_current}"]
    return lines


def format_table(a: Audit, max_pairs: int | None = None) -> str:
    shown = a.pairs if max_pairs is None else a.pairs[:max_pairs]
    return "\n".join(_summary(a) + _causes(a.causes) + _pairs(shown, len(a.pairs)))


def audit_json(a: Audit, max_pairs: int | None = None) -> dict:
    """What --json prints: the audit, with at most ``max_pairs`` pair rows."""
    modes = {m.name: {"kind": m.kind, "size": m.size, "definition": m.definition,
                      "cached_tokens": a.cached[i], "token_hit_ratio": a.ratio(m.name),
                      "cached_tokens_if_moved": a.cached_if_moved[i], "token_hit_ratio_if_moved": a.ratio(m.name, True)}
             for i, m in enumerate(MODES)}
    shown = a.pairs if max_pairs is None else a.pairs[:max_pairs]
    return {
        "log": a.log,
        "default_mode": a.default_mode,
        "assumption": ASSUMPTION,
        "token_hit_ratio": a.ratio(a.default_mode),
        "token_hit_ratio_if_moved": a.ratio(a.default_mode, True),
        "token_hit_ratio_by_mode": {m: v["token_hit_ratio"] for m, v in modes.items()},
        "token_hit_ratio_if_moved_by_mode": {m: v["token_hit_ratio_if_moved"] for m, v in modes.items()},
        "modes": modes,
        "requests": a.requests,
        "chat_requests": a.chat_requests,
        "completion_requests": a.requests - a.chat_requests,
        "sessions": {"total": a.sessions_given + a.sessions_inferred, "given": a.sessions_given,
                     "inferred": a.sessions_inferred},
        "prompt_tokens": a.prompt_tokens,
        "prompt_tokens_if_moved": a.prompt_tokens_if_moved,
        "pair_count": len(a.pairs),
        "parting_pairs": sum(1 for p in a.pairs if p.position is not None),
        "causes": [{"kind": c.kind, "position": c.position, "part": c.part, "requests": c.requests,
                    "sessions": c.sessions, "pairs": len(c.requests), "tokens_lost": c.tokens_lost,
                    "description": KINDS[c.kind]} for c in a.causes],
        "pairs": [_pair_dict(p) for p in shown],
    }


def _pair_dict(p: Pair) -> dict:
    return {"session": p.session, "previous_line": p.previous_line, "line": p.line,
            "previous_tokens": p.previous_tokens, "tokens": p.tokens, "common_prefix": p.common,
            "cached": dict(zip(MODE_NAMES, p.cached)), "cached_if_moved": dict(zip(MODE_NAMES, p.cached_if_moved)),
            "kind": p.kind, "position": p.position, "part": p.part,
            "token_previous": p.token_previous, "token_current": p.token_current,
            "excerpt_previous": p.excerpt_previous, "excerpt_current": p.excerpt_current}


def run(args: argparse.Namespace) -> int:
    result = audit_log(args.log, args.mode)
    limit = args.pairs or None
    if args.json:
        print(json.dumps(audit_json(result, limit), indent=2))
    else:
        print(format_table(result, limit))
    return 0
