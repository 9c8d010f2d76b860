"""NATS JWT decoding is bounded before it parses (issue 15 item 2).

JSON nested 2,000 or 100,000 deep used to raise RecursionError out of ``natsjwt.decode``, and a
5,000-digit number ValueError (Python's int-string limit); both escaped every caller that
catches CodecError. Every way a token can be wrong is now a CodecError naming what was wrong.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cotal_trio.core import natsjwt
from cotal_trio.core.errors import CodecError
from cotal_trio.core.nkeys import KeyPair, Prefix
from tests.support.callout_requests import signed_with

SIGNER = KeyPair.from_raw(Prefix.SERVER, bytes([1]) * 32)


def signed(claims_text: str | bytes, *, header: str | bytes | None = None) -> str:
    """A compact NATS JWT over any claims text, validly signed by ``SIGNER``."""
    return signed_with(SIGNER, claims_text, header=header)


HOSTILE = [
    ("2,000 deep arrays", '{"a":' + "[" * 2000 + "]" * 2000 + "}", "nests deeper than 64"),
    ("100,000 deep arrays", '{"a":' + "[" * 100_000 + "]" * 100_000 + "}", "nests deeper than 64"),
    ("100,000 deep objects", '{"a":' * 100_000 + "1" + "}" * 100_000, "nests deeper than 64"),
    ("100,000 unclosed", "[" * 100_000, "nests deeper than 64"),
    ("a 5,000-digit number", '{"iat":' + "9" * 5000 + "}", "more than 20 digits"),
    ("a 21-digit number", '{"iat":-' + "9" * 20 + "}", "more than 20 digits"),
    ("NaN", '{"iat":NaN}', "NaN is not JSON"),
    ("-Infinity", '{"iat":-Infinity}', "-Infinity is not JSON"),
    ("not UTF-8", b'{"a":"\xff\xfe"}', "claims is not JSON"),
    ("truncated", '{"a":[1,2', "claims is not JSON"),
    ("a top-level array", "[1]", "not a JSON object"),
]


@pytest.mark.parametrize(("name", "text", "match"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_claims_are_a_codec_error_never_another_exception(name, text, match):
    token = signed(text)
    with pytest.raises(CodecError, match=match):
        natsjwt.decode(token)
    with pytest.raises(CodecError, match=match):
        natsjwt.verify(token)


def test_depth_up_to_the_bound_parses_and_brackets_inside_strings_do_not_count():
    at_bound = '{"a":' + "[" * 63 + "]" * 63 + "}"  # 64 deep with the object
    assert natsjwt.decode(signed(at_bound)).claims["a"] == json.loads(at_bound)["a"]
    with pytest.raises(CodecError, match="nests deeper than 64"):
        natsjwt.decode(signed('{"a":' + "[" * 64 + "]" * 64 + "}"))
    in_strings = json.dumps({"a": "[" * 5000, "b": '\\"{' * 100, "c": [[["x"]]]})
    assert natsjwt.decode(signed(in_strings)).claims == json.loads(in_strings)


def test_a_20_character_integer_still_parses():
    assert natsjwt.decode(signed('{"n":-9223372036854775808}')).claims == {"n": -9223372036854775808}


def test_a_deep_header_and_an_oversized_token_are_refused_before_parsing():
    with pytest.raises(CodecError, match="header nests deeper"):
        natsjwt.decode(signed("{}", header="[" * 10_000 + "]" * 10_000))
    with pytest.raises(CodecError, match="at most 1048576 characters"):
        natsjwt.decode("a" * (natsjwt.MAX_JWT_CHARS + 1))


_DECODE_IN_A_CHILD = """
import sys
from cotal_trio.core import natsjwt
from cotal_trio.core.errors import CodecError
try:
    natsjwt.decode(sys.stdin.read())
except CodecError as exc:
    print("CodecError:", exc)
"""


def _decode_within(limit_s: float, token: str) -> str:
    """What ``natsjwt.decode(token)`` raised, run in a child process killed after ``limit_s``.

    A hang guard, not a timing assertion: the bound is far above any linear run. A child, since a
    regex holds the GIL, so no thread or signal in this process could interrupt it.
    """
    try:
        done = subprocess.run(
            [sys.executable, "-c", _DECODE_IN_A_CHILD], input=token, capture_output=True, text=True,
            timeout=limit_s, check=True,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"natsjwt.decode still ran after {limit_s}s: the depth check is not linear")
    return done.stdout


@pytest.mark.parametrize(
    "text",
    [
        "{" * 65 + '"' + '\\"' * 200_000,  # an unterminated string of escaped quotes (was quadratic: 52 s at 80 KB)
        "{" * 65 + '"' + '\\"' * 200_000 + "\\",  # ... ending in a lone backslash
        "[" * 65 + '"\\\\' * 100_000,  # many strings, each an escaped backslash, never closed
    ],
    ids=["escaped-quotes", "trailing-backslash", "escaped-backslashes"],
)
def test_the_depth_check_is_linear_on_unterminated_strings(text):
    assert _decode_within(30.0, signed(text)).startswith("CodecError: the JWT claims")


def test_escaped_backslashes_end_a_string_and_brackets_after_it_count():
    # '"\\\\"' is a string holding one backslash: the brackets after it are outside any string
    deep = '{"a":"\\\\",' + '"b":' + "[" * 70 + "]" * 70 + "}"
    with pytest.raises(CodecError, match="nests deeper than 64"):
        natsjwt.decode(signed(deep))
    shallow = '{"a":"\\\\\\"[[[[","b":' + "[" * 62 + "]" * 62 + "}"  # escaped quote keeps "[[[[" inside
    assert natsjwt.decode(signed(shallow)).claims == json.loads(shallow)
