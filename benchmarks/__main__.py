"""``python -m benchmarks list | run CASE [ARGS] [--smoke] [--results DIR] | report [--check] [--results DIR]``.

``run`` appends one JSON record to ``benchmarks/results/CASE.jsonl`` (``--smoke``: the case's size
that runs here in seconds; ``--results``: another folder, as the test suite uses, whose page is
``DIR/RESULTS.md``);
``report`` writes RESULTS.md from the records (``--check``: exit 1 when it is stale, or when a record
belongs to no case, a case has no full-size record, or a record's command is not its case's)."""

import sys

# The standard library's ``platform``, imported at start-up, would shadow the repository's package.
if "platform" in sys.modules and not hasattr(sys.modules["platform"], "__path__"):
    del sys.modules["platform"]

from pathlib import Path  # noqa: E402

from benchmarks import harness  # noqa: E402


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "list":
        for name in harness.CASES:
            print(f"{name:20} {harness.about(name).measures}")
        return 0
    results = harness.RESULTS
    if "--results" in rest:
        i = rest.index("--results")
        results, rest = Path(rest[i + 1]), rest[:i] + rest[i + 2:]
    if command == "run" and rest:
        smoke = "--smoke" in rest
        harness.run(rest[0], [a for a in rest[1:] if a != "--smoke"], smoke, results)
        return 0
    if command == "report":
        text, page = harness.report(results), harness.REPORT if results == harness.RESULTS else results / "RESULTS.md"
        if "--check" in rest:
            problems = harness.defects(results)
            if not page.is_file() or page.read_text(encoding="utf-8") != text:
                problems.append(f"{page} is stale: run `python -m benchmarks report`")
            for line in problems:
                print(line, file=sys.stderr)
            return 1 if problems else 0
        page.write_text(text, encoding="utf-8")
        print(f"wrote {page}")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


sys.exit(main(sys.argv[1:]))
