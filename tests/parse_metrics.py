#!/usr/bin/python3
"""parse_metrics.py FILE - parses a Prometheus text exposition with the
official client's parser (Debian python3-prometheus-client) and prints every
sample as one JSON object per line: {"family", "type", "name", "labels",
"value"}. Exits non-zero (with the parser's message) when the text does not
parse, so tests/check_metrics.c fails on malformed output."""
import json
import sys

from prometheus_client.parser import text_string_to_metric_families


def main():
    text = open(sys.argv[1], encoding="utf-8").read()
    n = 0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            print(json.dumps({"family": fam.name, "type": fam.type, "name": s.name,
                              "labels": s.labels, "value": s.value}))
            n += 1
    if n == 0:
        sys.exit("no samples")


if __name__ == "__main__":
    main()
