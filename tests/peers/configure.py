#!/usr/bin/env python3
"""Set values in the CodaLab config.json of $CODALAB_HOME, like `cl config KEY VALUE`.

One process for all keys instead of one ~2 s `cl config` call per key. The
config file is created first by CodaLab itself (CodaLabManager.init_config,
which also generates the server's secret_key), then each KEY=VALUE is set,
with `cl config`'s type conversion (true/false, int, float, else string).

Usage: CODALAB_HOME=... venv/bin/python configure.py a/b/c=VALUE ...
"""
import json
import sys

from codalab.lib.codalab_manager import CodaLabManager


def auto_convert_type(value):
    if value == 'true':
        return True
    if value == 'false':
        return False
    for conv in (int, float):
        try:
            return conv(value)
        except ValueError:
            pass
    return value


def main():
    path = CodaLabManager().config_path  # creates config.json when missing
    with open(path) as f:
        config = json.load(f)
    for arg in sys.argv[1:]:
        key, sep, value = arg.partition('=')
        if not sep:
            sys.exit('configure.py: expected KEY=VALUE, got %r' % arg)
        section = config
        parts = key.split('/')
        for part in parts[:-1]:
            section = section.setdefault(part, {})
        section[parts[-1]] = auto_convert_type(value)
    with open(path, 'w') as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write('\n')


if __name__ == '__main__':
    main()
