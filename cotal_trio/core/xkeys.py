"""xkeys: the curve25519 keys that seal auth callout requests and responses.

Wire format (reference/nats-operator-mode.md 11.1, stack-prototype.md section 3): a sealed message
is ``b"xkv1" + nonce (24 bytes) + NaCl box`` (X25519 + XSalsa20-Poly1305), boxed between the
sender's private key and the recipient's public key. The broker sends its own xkey in the
``Nats-Server-Xkey`` header; the callout opens with (space xkey, header key) and seals its answer
back to the same key.

Building a Box costs an X25519 multiplication (~165 us); boxes are cached per peer key, which
makes seal and open ~5 us.
"""

from __future__ import annotations

import functools
import secrets
from dataclasses import dataclass, field

import nacl.exceptions
import nacl.public

from .errors import CodecError
from .nkeys import RAW_KEY_BYTES, Prefix, decode_public_key, decode_seed, encode_public_key, encode_seed

__all__ = ["XKEY_VERSION", "XKeyPair"]

XKEY_VERSION = b"xkv1"
NONCE_BYTES = 24


@dataclass(frozen=True, slots=True, eq=False)
class XKeyPair:
    """A curve (``X...``) key with its private half. ``repr`` never shows the seed."""

    _private: nacl.public.PrivateKey = field(repr=False)
    public_key: str

    @classmethod
    def from_raw(cls, raw_seed: bytes) -> XKeyPair:
        """Build from 32 raw private bytes (CodecError if not 32 bytes)."""
        if len(raw_seed) != RAW_KEY_BYTES:
            raise CodecError("an xkey seed holds 32 bytes")
        private = nacl.public.PrivateKey(raw_seed)
        return cls(private, encode_public_key(Prefix.CURVE, bytes(private.public_key)))

    @classmethod
    def from_seed(cls, seed: str) -> XKeyPair:
        """Parse an ``SX...`` curve seed (CodecError if malformed or another role)."""
        prefix, raw = decode_seed(seed)
        if prefix != Prefix.CURVE:
            raise CodecError("expected a curve (xkey) seed, which starts with SX")
        return cls.from_raw(raw)

    @classmethod
    def generate(cls) -> XKeyPair:
        """A fresh xkey from the OS's CSPRNG."""
        return cls.from_raw(secrets.token_bytes(RAW_KEY_BYTES))

    @property
    def seed(self) -> str:
        """The 58-character ``SX...`` seed: the secret; store it 0600."""
        return encode_seed(Prefix.CURVE, bytes(self._private))

    def seal(self, plaintext: bytes, recipient: str, *, nonce: bytes | None = None) -> bytes:
        """Seal ``plaintext`` to the ``recipient`` xkey; returns ``xkv1 + nonce + box``.

        ``nonce`` (24 bytes) is for golden tests only; by default a random one is drawn.

        Raises:
            CodecError: ``recipient`` is not a curve public key.
        """
        nonce = secrets.token_bytes(NONCE_BYTES) if nonce is None else nonce
        box = _box(self, recipient)
        return XKEY_VERSION + nonce + box.encrypt(plaintext, nonce).ciphertext

    def open(self, sealed: bytes, sender: str) -> bytes:
        """Open a message ``sender`` sealed to this key.

        Raises:
            CodecError: no ``xkv1`` framing, too short, a bad sender key, or the box does not
                authenticate (tampered, or sealed to another key).
        """
        if not sealed.startswith(XKEY_VERSION) or len(sealed) < len(XKEY_VERSION) + NONCE_BYTES:
            raise CodecError("the message is not sealed with an xkey (no xkv1 framing)")
        body = sealed[len(XKEY_VERSION) :]
        try:
            return _box(self, sender).decrypt(body[NONCE_BYTES:], body[:NONCE_BYTES])
        except nacl.exceptions.CryptoError:
            raise CodecError("the sealed message does not open with this xkey") from None


@functools.lru_cache(maxsize=256)
def _box(own: XKeyPair, peer: str) -> nacl.public.Box:
    _, raw = decode_public_key(peer, Prefix.CURVE)
    return nacl.public.Box(own._private, nacl.public.PublicKey(raw))
