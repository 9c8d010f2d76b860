"""NATS nkeys: Ed25519 identities as prefixed, checksummed base32 strings.

Wire facts (reference/stack-prototype.md section 4, "Signing and verifying"): a public key is
``base32(prefix byte + 32 raw bytes + crc16 little-endian)`` with no padding (56 characters); a
seed is ``base32(2 prefix bytes + 32 raw bytes + crc16)`` (58 characters), where the two bytes pack
the seed marker ``S`` with the key's role prefix. The crc is CRC-16/XMODEM (polynomial 0x1021, init
0). Curve (``X``) keys share the encoding; their crypto lives in :mod:`cotal_trio.core.xkeys`.

nkeys.py on PyPI has no public-key decode, no curve keys and no key creation (pitfall 12), so the
codec is ours; Ed25519 itself is PyNaCl (libsodium), the fastest of the available bindings.
"""

from __future__ import annotations

import base64
import binascii
import enum
import functools
import re
import secrets
from dataclasses import dataclass, field

import nacl.exceptions
import nacl.signing

from .errors import CodecError

__all__ = [
    "KeyPair",
    "is_public_key",
    "looks_like_public_key",
    "Prefix",
    "decode_public_key",
    "decode_seed",
    "encode_public_key",
    "encode_seed",
    "verify",
]

RAW_KEY_BYTES = 32
PUBLIC_KEY_CHARS = 56
SEED_CHARS = 58


class Prefix(enum.IntEnum):
    """The role byte of an nkey; the first base32 character of the encoding shows it."""

    SEED = 18 << 3  # 'S'
    PRIVATE = 15 << 3  # 'P'
    SERVER = 13 << 3  # 'N'
    CLUSTER = 2 << 3  # 'C'
    OPERATOR = 14 << 3  # 'O'
    ACCOUNT = 0  # 'A'
    USER = 20 << 3  # 'U'
    CURVE = 23 << 3  # 'X'

    @property
    def letter(self) -> str:
        """The first character of a public key with this prefix (``"A"`` for ACCOUNT, ...)."""
        return _LETTERS[self]


_LETTERS = {p: "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"[p >> 3] for p in Prefix}
_ROLES = frozenset(Prefix) - {Prefix.SEED, Prefix.PRIVATE}


def _crc16(data: bytes) -> int:
    """CRC-16/XMODEM of ``data``, as nkeys checksums them."""
    return binascii.crc_hqx(data, 0)


def _b32decode(text: str) -> bytes:
    if not isinstance(text, str) or not text.isascii():
        raise CodecError("an nkey must be an ASCII string")
    padded = text + "=" * (-len(text) % 8)
    try:
        return base64.b32decode(padded)
    except (binascii.Error, ValueError):
        raise CodecError("an nkey is not valid base32") from None


def _checked(text: str) -> bytes:
    """Decode ``text`` and strip its checksum; raises CodecError when the crc is wrong."""
    raw = _b32decode(text)
    if len(raw) < 3:
        raise CodecError("an nkey is too short")
    body, crc = raw[:-2], int.from_bytes(raw[-2:], "little")
    if _crc16(body) != crc:
        raise CodecError("an nkey's checksum does not match (a typo or a truncated key)")
    return body


def _with_crc(body: bytes) -> str:
    return base64.b32encode(body + _crc16(body).to_bytes(2, "little")).decode().rstrip("=")


def encode_public_key(prefix: Prefix, raw: bytes) -> str:
    """Encode 32 raw public-key bytes with a role prefix; returns the 56-character key."""
    if prefix not in _ROLES or len(raw) != RAW_KEY_BYTES:
        raise CodecError("a public nkey needs a role prefix and 32 raw bytes")
    return _with_crc(bytes([prefix]) + raw)


def decode_public_key(key: str, expected: Prefix | None = None) -> tuple[Prefix, bytes]:
    """Decode a public nkey into ``(prefix, 32 raw bytes)``.

    Raises:
        CodecError: not a well-formed public key, wrong checksum, or (when ``expected`` is
            given) a key of another role.
    """
    if not isinstance(key, str) or len(key) != PUBLIC_KEY_CHARS:
        raise CodecError("a public nkey is 56 characters")
    body = _checked(key)
    try:
        prefix = Prefix(body[0])
    except ValueError:
        raise CodecError("a public nkey has an unknown role prefix") from None
    if prefix not in _ROLES:
        raise CodecError("a seed was given where a public nkey belongs")
    if expected is not None and prefix != expected:
        raise CodecError(f"expected a public {expected.name.lower()} nkey, got {prefix.name.lower()}")
    return prefix, body[1:]


def encode_seed(prefix: Prefix, raw: bytes) -> str:
    """Encode a 32-byte seed for a role; returns the 58-character ``S...`` seed."""
    if prefix not in _ROLES or len(raw) != RAW_KEY_BYTES:
        raise CodecError("a seed needs a role prefix and 32 raw bytes")
    b1 = Prefix.SEED | (prefix >> 5)
    b2 = (prefix & 31) << 3
    return _with_crc(bytes([b1, b2]) + raw)


def decode_seed(seed: str) -> tuple[Prefix, bytes]:
    """Decode an ``S...`` seed into ``(role prefix, 32 raw seed bytes)``.

    Raises:
        CodecError: not a seed, wrong checksum, or an unknown role.
    """
    if not isinstance(seed, str) or len(seed) != SEED_CHARS:
        raise CodecError("an nkey seed is 58 characters starting with S")
    body = _checked(seed)
    if body[0] & 0xF8 != Prefix.SEED:
        raise CodecError("not an nkey seed (it must start with S)")
    role = ((body[0] & 7) << 5) | ((body[1] & 0xF8) >> 3)
    try:
        prefix = Prefix(role)
    except ValueError:
        raise CodecError("an nkey seed has an unknown role prefix") from None
    if prefix not in _ROLES:
        raise CodecError("an nkey seed has an unknown role prefix")
    return prefix, body[2:]


@dataclass(frozen=True, slots=True)
class KeyPair:
    """An nkey with its private half: signs NATS JWTs and nonces.

    Build one with :meth:`from_seed`, :meth:`from_raw` or :meth:`generate`; the seed string
    is the only serialised form. ``repr`` never shows the seed.
    """

    prefix: Prefix
    _raw_seed: bytes = field(repr=False)
    _signer: nacl.signing.SigningKey = field(repr=False, compare=False)
    public_key: str = field(compare=False)

    @classmethod
    def from_raw(cls, prefix: Prefix, raw_seed: bytes) -> KeyPair:
        """Build from a role and 32 raw seed bytes (CodecError if malformed)."""
        if prefix not in _ROLES or prefix == Prefix.CURVE or len(raw_seed) != RAW_KEY_BYTES:
            raise CodecError("a signing nkey needs a non-curve role and a 32-byte seed")
        signer = nacl.signing.SigningKey(raw_seed)
        public = encode_public_key(prefix, bytes(signer.verify_key))
        return cls(prefix, raw_seed, signer, public)

    @classmethod
    def from_seed(cls, seed: str) -> KeyPair:
        """Parse an ``S...`` seed (CodecError if malformed or a curve seed)."""
        prefix, raw = decode_seed(seed)
        if prefix == Prefix.CURVE:
            raise CodecError("a curve (xkey) seed cannot sign; use cotal_trio.core.xkeys")
        return cls.from_raw(prefix, raw)

    @classmethod
    def generate(cls, prefix: Prefix) -> KeyPair:
        """A fresh key of the given role from the OS's CSPRNG."""
        return cls.from_raw(prefix, secrets.token_bytes(RAW_KEY_BYTES))

    @property
    def seed(self) -> str:
        """The 58-character seed string: the secret; store it 0600."""
        return encode_seed(self.prefix, self._raw_seed)

    def sign(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``data`` (deterministic)."""
        return self._signer.sign(data).signature


@functools.lru_cache(maxsize=4096)
def _verify_key(public_key: str) -> nacl.signing.VerifyKey:
    prefix, raw = decode_public_key(public_key)
    if prefix == Prefix.CURVE:
        raise CodecError("a curve (xkey) public key cannot verify signatures")
    return nacl.signing.VerifyKey(raw)


def verify(public_key: str, data: bytes, signature: bytes) -> bool:
    """True when ``signature`` is ``public_key``'s Ed25519 signature of ``data``.

    Raises:
        CodecError: ``public_key`` is not a well-formed signing public nkey.
    """
    try:
        _verify_key(public_key).verify(data, signature)
    except (nacl.exceptions.BadSignatureError, ValueError, TypeError):
        return False
    return True


@functools.lru_cache(maxsize=1024)
def is_public_key(key: str, prefix: Prefix) -> bool:
    """True when ``key`` is a well-formed public nkey of role ``prefix`` (checksum included).

    Cached: the callout checks the same broker server keys on every request.
    """
    try:
        decode_public_key(key, prefix)
    except CodecError:
        return False
    return True


def looks_like_public_key(key: object, prefix: Prefix) -> bool:
    """True when ``key`` has the shape of a public nkey of role ``prefix`` (no checksum check).

    For keys inside a payload whose signature was already verified, such as the fresh user
    key of each authorization request, where a full base32 decode per request buys nothing.
    """
    return isinstance(key, str) and _SHAPE[prefix].fullmatch(key) is not None


_SHAPE = {p: re.compile(p.letter + "[A-Z2-7]{55}") for p in _ROLES}
