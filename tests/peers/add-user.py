#!/usr/bin/env python3
"""Create (or reset) a verified, active, NON-root CodaLab user directly in the DB.

Signing up over REST needs reCAPTCHA and e-mail verification, and CodaLab has no
admin "create user" command, so the test peer creates its users through the
CodaLab model API (`BundleModel.add_user` / `update_user_info`), the same calls
CodaLab's own scripts/create-root-user.py uses for the root user.

Run with the peer venv's Python and CODALAB_HOME set (the script reads the
server's config.json to find the database):
    CODALAB_HOME=... venv/bin/python add-user.py USERNAME PASSWORD|- [--email E]   (-: from stdin)
Idempotent: an existing user gets its password reset and is (re)activated and
verified. Prints the user id.
"""
import argparse
import sys

from codalab.lib import crypt_util
from codalab.lib.codalab_manager import CodaLabManager
from codalab.objects.user import User


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('username')
    parser.add_argument('password')
    parser.add_argument('--email', help='default: USERNAME@example.com (must be unique)')
    parser.add_argument('--first-name', default='CL')
    parser.add_argument('--last-name', default='Test')
    args = parser.parse_args()
    if args.password == '-':  # from stdin: a password in argv is visible to every local user
        args.password = sys.stdin.readline().rstrip('\n')

    manager = CodaLabManager()
    if args.username == manager.root_user_name():
        sys.exit('add-user.py: %r is the root user; use create-root-user.py' % args.username)
    model = manager.model()  # first use also creates the schema if needed
    email = args.email or '%s@example.com' % args.username

    user = model.get_user(username=args.username, check_active=False)
    if user is not None and user.user_name != args.username:
        sys.exit('add-user.py: %r matches the e-mail of user %r' % (args.username, user.user_name))
    if user is None:
        user_id, _ = model.add_user(
            args.username,
            email,
            args.first_name,
            args.last_name,
            args.password,
            '',  # affiliation
            is_verified=True,
            has_access=True,
        )
    else:
        user_id = user.user_id
        model.update_user_info(
            {
                'user_id': user_id,
                'password': User.encode_password(args.password, crypt_util.get_random_string()),
                'is_active': True,
                'is_verified': True,
                'has_access': True,
            }
        )
    print(user_id)


if __name__ == '__main__':
    main()
