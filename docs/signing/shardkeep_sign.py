#!/usr/bin/env python3
"""Sign and send a request to shardkeep's internal API (`/v1/internal/...`).

Python 3 standard library only. Use it as a command, or import `sign_headers` into a game
server. The scheme is the one in `crates/shardkeep-ops/src/signing.rs` and `auth.rs`; see
README.md next to this file.

    export SHARDKEEP_SECRET=...   # the text after `ops:` in SHARDKEEP_INTERNAL_KEYS
    python3 shardkeep_sign.py --key-id ops GET '/v1/internal/persistence-retry/dead-letters?limit=5'
    python3 shardkeep_sign.py --key-id ops POST /v1/internal/persistence-retry/dead-letters/requeue \\
        --body '{"rpc_version":1,"dead_letter_id":"..."}'

Exit status: 0 on a 2xx answer (the body is printed to stdout, JSON pretty-printed); 1 on any
other HTTP status (`shardkeep_sign: HTTP <status>` and the body go to stderr); 2 on a usage
error; 3 when the server cannot be reached.
"""

import argparse
import hashlib
import hmac
import http.client
import json
import os
import re
import secrets
import sys
import time
import urllib.error
import urllib.request

KEY_ID_HEADER = "x-shardkeep-key-id"
TIMESTAMP_HEADER = "x-shardkeep-timestamp"
NONCE_HEADER = "x-shardkeep-nonce"
SIGNATURE_HEADER = "x-shardkeep-signature"

DEFAULT_BASE = "http://127.0.0.1:7400"
DEFAULT_SECRET_ENV = "SHARDKEEP_SECRET"
TIMEOUT_SECONDS = 60

_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_NONCE_CHARS = _ALNUM | frozenset("_-")
_KEY_ID_CHARS = _ALNUM | frozenset("_-.")
# Characters a path and query may hold here: RFC 3986 unreserved and reserved characters and
# `%` for percent-escapes. Anything else (spaces, quotes, `{}`, `[]`, `#`, non-ASCII) is
# rewritten or refused by some HTTP client or proxy, and the server checks the signature
# against the bytes it receives, so such a path would fail as `bad_signature`.
_PATH_CHARS = _ALNUM | frozenset("-._~!$&'()*+,;=:@/?%")
# What Rust's `str::trim` removes (Unicode White_Space): the server trims each secret in
# SHARDKEEP_INTERNAL_KEYS with it, so surrounding whitespace is never part of a secret.
_RUST_WHITESPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_ASCII_WHITESPACE = b"\t\n\x0b\x0c\r "


class UsageError(ValueError):
    """An argument the server could never accept."""


def nonce_is_valid(nonce):
    """True for 16 to 64 characters of [A-Za-z0-9_-] (what the server accepts)."""
    return isinstance(nonce, str) and 16 <= len(nonce) <= 64 and set(nonce) <= _NONCE_CHARS


def new_nonce():
    """A fresh nonce: 32 lowercase hex characters (128 random bits)."""
    return secrets.token_hex(16)


def _secret_bytes(secret):
    """The HMAC key: the UTF-8 bytes of the secret text, surrounding whitespace removed."""
    if isinstance(secret, str):
        return secret.strip(_RUST_WHITESPACE).encode("utf-8")
    if isinstance(secret, (bytes, bytearray)):
        return bytes(secret).strip(_ASCII_WHITESPACE)
    raise TypeError("secret must be str or bytes")


def _check_method(method):
    if not (isinstance(method, str) and method and method.isascii() and method.isalpha()):
        raise UsageError(f"{method!r} is not an HTTP method")
    return method.upper()


def _check_path(path_and_query):
    if not (isinstance(path_and_query, str) and path_and_query.startswith("/")):
        raise UsageError("the path must start with / (the path and query only, no scheme or host)")
    bad = sorted(set(path_and_query) - _PATH_CHARS)
    if bad:
        raise UsageError(
            f"the path holds {''.join(bad)!r}: percent-encode it first "
            "(the signature covers the path exactly as sent)"
        )
    return path_and_query


def _check_key_id(key_id):
    if not (isinstance(key_id, str) and key_id and set(key_id) <= _KEY_ID_CHARS):
        raise UsageError("the key id must be 1 or more characters of [A-Za-z0-9_.-]")
    return key_id


def _check_timestamp(timestamp):
    if isinstance(timestamp, bool) or not isinstance(timestamp, int):
        raise UsageError("the timestamp must be an integer (unix seconds)")
    if not -(2**63) <= timestamp < 2**63:
        raise UsageError("the timestamp does not fit in 64 bits")
    return timestamp


def canonical_string(method, path_and_query, timestamp, nonce, body_bytes=b""):
    """The five lines the signature covers, joined by "\\n" (no trailing newline)."""
    return "\n".join(
        [
            method.upper(),
            path_and_query,
            str(timestamp),
            nonce,
            hashlib.sha256(body_bytes or b"").hexdigest(),
        ]
    )


def sign(secret, canonical):
    """Lowercase hex HMAC-SHA256 of `canonical` (UTF-8) under `secret`."""
    return hmac.new(_secret_bytes(secret), canonical.encode("utf-8"), hashlib.sha256).hexdigest()


def _sign(method, path_and_query, body_bytes, key_id, secret, timestamp, nonce):
    method = _check_method(method)
    path_and_query = _check_path(path_and_query)
    key_id = _check_key_id(key_id)
    timestamp = int(time.time()) if timestamp is None else _check_timestamp(timestamp)
    nonce = new_nonce() if nonce is None else nonce
    if not nonce_is_valid(nonce):
        raise UsageError("the nonce must be 16 to 64 characters of [A-Za-z0-9_-]")
    if body_bytes is None:
        body = b""
    elif isinstance(body_bytes, str):
        body = body_bytes.encode("utf-8")
    else:
        body = bytes(body_bytes)
    canonical = canonical_string(method, path_and_query, timestamp, nonce, body)
    headers = {
        KEY_ID_HEADER: key_id,
        TIMESTAMP_HEADER: str(timestamp),
        NONCE_HEADER: nonce,
        SIGNATURE_HEADER: sign(secret, canonical),
    }
    return headers, canonical


def sign_headers(method, path_and_query, body_bytes, key_id, secret, timestamp=None, nonce=None):
    """The four signature headers of one request, as a dict.

    method          -- "GET", "POST", ... (upper-cased; send the request with the same method)
    path_and_query  -- exactly what goes on the request line, e.g. "/v1/internal/x?limit=5";
                       already percent-encoded, no scheme, host or fragment
    body_bytes      -- the exact bytes sent as the body (b"" or None for no body; a str is
                       taken as its UTF-8 bytes)
    key_id          -- the key id, as in SHARDKEEP_INTERNAL_KEYS
    secret          -- its secret: str (its UTF-8 bytes are the key) or bytes; surrounding
                       whitespace is ignored, as the server ignores it
    timestamp       -- unix seconds (int); default now
    nonce           -- 16 to 64 of [A-Za-z0-9_-]; default a fresh random one. Never reuse one.

    Raises ValueError (UsageError) for an argument the server would refuse.
    """
    return _sign(method, path_and_query, body_bytes, key_id, secret, timestamp, nonce)[0]


# ---- command line ---------------------------------------------------------------------------


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is answered as an error: re-sending the signed headers elsewhere never verifies."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def _print_body(raw, stream):
    """Pretty-prints a JSON body; prints anything else as it came."""
    if not raw:
        return
    try:
        text = json.dumps(json.loads(raw), indent=2, ensure_ascii=False) + "\n"
        data = text.encode("utf-8")
    except ValueError:
        data = raw if raw.endswith(b"\n") else raw + b"\n"
    stream.flush()
    binary = getattr(stream, "buffer", None)
    if binary is None:
        stream.write(data.decode("utf-8", "replace"))
    else:
        binary.write(data)
        binary.flush()


def _parser():
    p = argparse.ArgumentParser(
        prog="shardkeep_sign.py",
        description="Sign and send one request to shardkeep's internal API.",
        epilog="The secret is read from the environment variable named by --secret-env, never "
        "from the command line. Exit status: 0 on 2xx, 1 on any other HTTP status, 2 on a usage "
        "error, 3 when the server cannot be reached.",
    )
    p.add_argument(
        "--base",
        default=os.environ.get("SHARDKEEP_API_URL") or DEFAULT_BASE,
        help="scheme://host:port of `shardkeep serve` (default: $SHARDKEEP_API_URL or %(default)s)",
    )
    p.add_argument("--key-id", required=True, help="the key id, as in SHARDKEEP_INTERNAL_KEYS")
    p.add_argument(
        "--secret-env",
        default=DEFAULT_SECRET_ENV,
        metavar="NAME",
        help="environment variable holding the secret (default: %(default)s)",
    )
    body = p.add_mutually_exclusive_group()
    body.add_argument("--body", help="request body, sent byte for byte (e.g. a JSON document)")
    body.add_argument("--body-file", metavar="PATH", help="read the body from PATH (- for stdin)")
    p.add_argument(
        "--print-headers",
        action="store_true",
        help="print the signature headers and the canonical string; send nothing",
    )
    p.add_argument("--timestamp", metavar="UNIX_SECONDS", help="sign with this timestamp")
    p.add_argument("--nonce", help="sign with this nonce (16-64 of [A-Za-z0-9_-])")
    p.add_argument("method", metavar="METHOD", help="GET or POST")
    p.add_argument("path", metavar="PATH", help="path and query, e.g. '/v1/internal/...?limit=5'")
    return p


def _fail_usage(message):
    print(f"shardkeep_sign: error: {message}", file=sys.stderr)
    return 2


_VALUE_OPTIONS = ("--base", "--key-id", "--secret-env", "--body", "--body-file", "--timestamp", "--nonce")


def _join_values(argv):
    """`--nonce -x...` as `--nonce=-x...`: a nonce or a body may start with `-`, which argparse
    would otherwise take for an option."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] in _VALUE_OPTIONS and i + 1 < len(argv):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(_join_values(argv))  # exits 2 on a usage error

    secret_text = os.environ.get(args.secret_env)
    if not secret_text:
        return _fail_usage(f"the environment variable {args.secret_env} is unset or empty")
    # The environment's original bytes (what the server reads from SHARDKEEP_INTERNAL_KEYS),
    # without the surrounding whitespace the server trims too.
    secret = os.fsencode(secret_text.strip(_RUST_WHITESPACE))
    if len(secret) < 16:
        return _fail_usage(
            f"the secret in {args.secret_env} is shorter than 16 bytes; the server accepts no such key"
        )

    timestamp = None
    if args.timestamp is not None:
        if not re.fullmatch(r"-?[0-9]+", args.timestamp):
            return _fail_usage("--timestamp must be an integer (unix seconds)")
        timestamp = int(args.timestamp)

    if args.body is not None:
        body = os.fsencode(args.body)  # the argument's bytes exactly
    elif args.body_file == "-":
        body = sys.stdin.buffer.read()
    elif args.body_file is not None:
        try:
            with open(args.body_file, "rb") as f:
                body = f.read()
        except OSError as e:
            return _fail_usage(f"cannot read --body-file: {e}")
    else:
        body = None

    try:
        headers, canonical = _sign(
            args.method, args.path, body, args.key_id, secret, timestamp, args.nonce
        )
    except ValueError as e:
        return _fail_usage(str(e))

    if args.print_headers:
        lines = [f"{name}: {value}" for name, value in headers.items()]
        sys.stdout.write("\n".join(lines) + "\n\n" + canonical + "\n")
        return 0

    base = args.base.rstrip("/")
    if not (base.startswith("http://") or base.startswith("https://")):
        return _fail_usage("--base must start with http:// or https://")
    url = base + args.path
    send_headers = dict(headers)
    send_headers["Accept"] = "application/json"
    if body is not None:
        send_headers["Content-Type"] = "application/json"
    request = urllib.request.Request(
        url, data=body, headers=send_headers, method=args.method.upper()
    )
    opener = urllib.request.build_opener(_NoRedirect())
    try:
        with opener.open(request, timeout=TIMEOUT_SECONDS) as response:
            raw = response.read()
    except urllib.error.HTTPError as e:
        raw = e.read()
        print(f"shardkeep_sign: HTTP {e.code}", file=sys.stderr)
        _print_body(raw, sys.stderr)
        return 1
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        print(f"shardkeep_sign: cannot reach {base}: {reason}", file=sys.stderr)
        return 3
    _print_body(raw, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
