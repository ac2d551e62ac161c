#!/usr/bin/python3
"""Validates generated outputs against their JSON Schemas with python3-jsonschema (the oracle).

Input: a JSON file [{"schema": PATH, "output": TEXT, "label": TEXT}, ...]. Each schema is validated
with the validator of the draft it declares ($schema; the latest otherwise), formats checked where
jsonschema has a checker. Prints one line per invalid output and a summary line
"valid V / generated N"; exits 1 when any output does not parse or does not validate, or when the
validator takes over 60 s on one output.

anyOf and oneOf are checked with is_valid (which stops at a branch's first error) instead of
jsonschema's own, which collects every error of every branch: on a recursive schema (a grammar's
rules, nested 15 deep) that is exponential in the depth. The verdicts are the same.
"""
import json
import signal
import sys

import jsonschema


def any_of(validator, branches, instance, schema):
    if not any(validator.evolve(schema=s).is_valid(instance) for s in branches):
        yield jsonschema.ValidationError("%r is not valid under any of the given schemas" % (instance,))


def one_of(validator, branches, instance, schema):
    n = sum(1 for s in branches if validator.evolve(schema=s).is_valid(instance))
    if n != 1:
        yield jsonschema.ValidationError("%r is valid under %d of the oneOf schemas, not exactly one" % (instance, n))


def on_alarm(signum, frame):
    raise TimeoutError()


def main():
    signal.signal(signal.SIGALRM, on_alarm)
    cases = json.load(open(sys.argv[1], encoding="utf-8"))
    bad = 0
    for case in cases:
        schema = json.load(open(case["schema"], encoding="utf-8"))
        try:
            value = json.loads(case["output"])
        except ValueError as e:
            bad += 1
            print("NOT JSON %s (%s): %s: %r" % (case["schema"], case.get("label", ""), e, case["output"][:300]))
            continue
        cls = jsonschema.validators.extend(jsonschema.validators.validator_for(schema), {"anyOf": any_of, "oneOf": one_of})
        validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
        signal.alarm(60)
        try:
            errors = list(validator.iter_errors(value))
        except TimeoutError:
            bad += 1
            print("TIMEOUT %s (%s): the validator took over 60 s: %r" % (case["schema"], case.get("label", ""),
                                                                       case["output"][:300]))
            continue
        finally:
            signal.alarm(0)
        if errors:
            bad += 1
            print("INVALID %s (%s): %s at %s: %r" % (case["schema"], case.get("label", ""), errors[0].message[:200],
                                                     list(errors[0].absolute_path), case["output"][:300]))
    print("valid %d / generated %d" % (len(cases) - bad, len(cases)))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
