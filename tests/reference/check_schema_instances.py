#!/usr/bin/python3
"""Independent oracle for tests/plugins/constraint_schema_test.cpp: checks hand-written instances
against their JSON Schemas with python3-jsonschema (format checking on).

Input: a JSON file [{"schema": ..., "valid": [...], "invalid": [...]}, ...]. Prints one line per
disagreement and exits 1 if there is any, 0 otherwise; exits 3 when jsonschema is not installed."""
import json
import sys

try:
    import jsonschema
except ImportError:
    print("python3-jsonschema is not installed")
    sys.exit(3)


def format_checker(cls):
    checker = cls.FORMAT_CHECKER
    if "date-time" not in checker.checkers:
        # jsonschema checks date-time only with rfc3339-validator, which Debian does not package;
        # the standard library's ISO 8601 parser (3.11+) stands in, with RFC 3339's 'T' and zone required.
        import datetime
        import re

        @checker.checks("date-time", raises=ValueError)
        def _date_time(value):
            if not isinstance(value, str):
                return True
            if not re.fullmatch(r"\d{4}-\d\d-\d\d[Tt]\d\d:\d\d:\d\d(\.\d+)?([Zz]|[+-]\d\d:\d\d)", value):
                return False
            datetime.datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
            return True
    return checker


def main():
    cases = json.load(open(sys.argv[1], encoding="utf-8"))
    bad = 0
    for i, case in enumerate(cases):
        cls = jsonschema.validators.validator_for(case["schema"], default=jsonschema.Draft202012Validator)
        validator = cls(case["schema"], format_checker=format_checker(cls))
        for text in case["valid"]:
            errors = list(validator.iter_errors(json.loads(text)))
            if errors:
                bad += 1
                print(f"case {i}: expected valid, jsonschema says {errors[0].message}: {text}")
        for text in case["invalid"]:
            if validator.is_valid(json.loads(text)):
                bad += 1
                print(f"case {i}: expected invalid, jsonschema accepts: {text}")
    print(f"{bad} disagreements over {len(cases)} cases")
    sys.exit(1 if bad else 0)


main()
