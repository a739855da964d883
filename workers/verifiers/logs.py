"""The `log_rules` check: rules over the execution logs of the sample's tool calls.

A `fail` rule that matches anywhere fails the sample (value 0, the matching line as evidence). `pass` rules
must all match for a 1. With no pass rules and no failing match the value is 1. Logs are capped before
matching so a flood of output cannot make matching slow.
"""

import re

from workers.definitions.specs import LogRules

from .types import Outcome

MAX_LOG_CHARS = 1_000_000


def log_rules_check(spec: LogRules, sample, item, context) -> Outcome:
    if not sample.logs:
        return Outcome(value=None, status="skipped", evidence="no execution logs")
    logs = sample.logs[-MAX_LOG_CHARS:]
    for rule in spec.rules:
        if rule.effect == "fail" and (match := re.search(rule.pattern, logs, re.MULTILINE)):
            line = logs[logs.rfind("\n", 0, match.start()) + 1:logs.find("\n", match.end())][:200]
            return Outcome.scored(0, f"log matches {rule.pattern!r}: {line}")
    required = [rule.pattern for rule in spec.rules if rule.effect == "pass"]
    missing = [pattern for pattern in required if not re.search(pattern, logs, re.MULTILINE)]
    if missing:
        return Outcome.scored(0, f"log lacks {missing[0]!r}")
    return Outcome.scored(1)
