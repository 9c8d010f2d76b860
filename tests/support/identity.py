"""Identity vectors: lone-surrogate subjects and the base32 the owner ids use."""

from __future__ import annotations


def _base32_lower_nopad(data: bytes) -> str:
    """RFC 4648 base32, written out bit by bit (independent of the base64 module)."""
    alphabet = "abcdefghijklmnopqrstuvwxyz234567"
    bits = "".join(f"{byte:08b}" for byte in data)
    bits += "0" * (-len(bits) % 5)
    return "".join(alphabet[int(bits[i : i + 5], 2)] for i in range(0, len(bits), 5))


# Issue 15 item 6: an IdP ``sub`` may hold a lone surrogate (a JWT payload's JSON can carry
# "\ud800", which decodes to a lone surrogate str). JSON.stringify (ES2019, well-formed) writes a
# lone surrogate as a lowercase \uXXXX escape and a high+low pair as the one character it forms.
# These first 16 MAC bytes were computed by Node 20:
#   createHmac("sha256", secret).update("cotal-owner-v1:" + JSON.stringify([iss, sub]))
LONE_SURROGATE_VECTORS = [
    ("\ud800x", '["https://idp.example","\\ud800x"]', "6d77db3787d97d3cf012f57f168902fd"),
    ("a\udc00", '["https://idp.example","a\\udc00"]', "db8e7a18d942c396fe1572e75f4204e1"),
    ("x\ud83d", '["https://idp.example","x\\ud83d"]', "e7546246d53726bad1034dcb1c3bb613"),
    ("\ud83d\ude00", '["https://idp.example","\U0001f600"]', "a9d6d3e4e2cb58fb4e72a8eede86d674"),
]
