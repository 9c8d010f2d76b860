"""The lane's own users' allow-lists and the issuer session's schedule (issue 15 item 4;
lane/service_users.py; docs/wire-layout.md "The service's own users"). The broker's refusals
are tests/lane/test_service_credentials_live.py."""

from __future__ import annotations

import pytest

from cotal_trio.core.profiles import provisioner_permissions
from cotal_trio.lane.service_users import (
    ISSUER_LIFETIME_S,
    STORE_LIFETIME_S,
    IssuerSession,
    recreate_permissions,
    renewal_times,
    replica_store_permissions,
    store_permissions,
)

NONCE = "n" * 24


def _api(stream: str, *verbs: str) -> list[str]:
    return [f"$JS.API.STREAM.{verb}.{stream}" for verb in verbs]


def test_a_full_lane_store_user_holds_exactly_its_lists() -> None:
    got = store_permissions("demo", NONCE)
    own = [
        *_api("KV_cotal_auth_demo", "INFO", "CREATE", "UPDATE", "MSG.GET"), "$KV.cotal_auth_demo.>",
        *_api("KV_cotal_records_demo", "INFO", "CREATE", "UPDATE", "MSG.GET"), "$KV.cotal_records_demo.>",
        *_api("KV_cotal_sessions_demo", "INFO", "CREATE", "UPDATE", "MSG.GET"), "$KV.cotal_sessions_demo.>",
    ]  # fmt: skip
    provisioner = [s for s in provisioner_permissions(space="demo", inbox_nonce=NONCE).pub_allow if not s.startswith("$SYS")]
    issued = [*_api("KV_cotal_issued_demo", "INFO", "CREATE"), *_api("KV_cotal_accepted_demo", "INFO", "CREATE")]
    # issue 17 item 1: the lane scales every stream it creates up to the space's replicas
    scaled = [
        f"$JS.API.STREAM.UPDATE.{stream}" for stream in (
            "COTAL_CHAT_demo", "COTAL_DM_demo", "COTAL_TASK_demo", "COTAL_RUN_demo", "KV_cotal_channels_demo", "KV_cotal_admission_demo",
            "KV_cotal_issued_demo", "KV_cotal_accepted_demo",
        )
    ]  # fmt: skip
    assert got == {
        "pub": {"allow": [*own, *provisioner, "$JS.API.STREAM.UPDATE.KV_cotal_presence_demo", *issued, *scaled]},
        "sub": {"allow": [f"_INBOX_{NONCE}.>"]},
    }


def test_a_replica_store_user_reads_and_writes_issuance_rows_only() -> None:
    assert replica_store_permissions("demo", NONCE) == {
        "pub": {"allow": [
            "$JS.API.STREAM.MSG.GET.KV_cotal_auth_demo", "$JS.API.STREAM.MSG.GET.KV_cotal_records_demo",
            "$JS.API.STREAM.MSG.GET.KV_cotal_sessions_demo", "$KV.cotal_auth_demo.natkey.>",
            "$JS.API.STREAM.INFO.KV_cotal_auth_demo",
        ]},
        "sub": {"allow": [f"_INBOX_{NONCE}.>"]},
    }  # fmt: skip


@pytest.mark.parametrize("permissions", [store_permissions, replica_store_permissions])
def test_no_store_user_purges_deletes_direct_reads_or_touches_the_issued_rows(permissions) -> None:
    allowed = permissions("demo", NONCE)["pub"]["allow"]
    forbidden = ("PURGE", "DELETE", "DIRECT", "ACCOUNT", "$KV.cotal_issued", "$KV.cotal_accepted", "MSG.GET.KV_cotal_issued")
    assert [s for s in allowed if s in ("$JS.>", "$JS.API.>") or any(f in s for f in forbidden)] == []


def test_a_session_is_renewed_a_third_before_its_expiry_and_the_old_one_kept_a_sixth_after() -> None:
    """``(renew_in, grace)``: the old session stays open ``grace`` seconds after its replacement
    is in, never past its own expiry."""
    assert ISSUER_LIFETIME_S == 300 and STORE_LIFETIME_S == 86400
    assert renewal_times(300, 300) == (200, 50)
    assert renewal_times(300, 299.5) == (199.5, 50)
    assert renewal_times(6, 5) == (3, 1)
    assert renewal_times(300, 10) == (0, 10)  # already late: renew at once, keep it until it expires
    assert renewal_times(300, -1) == (0, 0)  # never a negative wait


def test_the_recreate_user_holds_the_two_issued_stores_four_verbs_only() -> None:
    streams = ("KV_cotal_issued_demo", "KV_cotal_accepted_demo")
    assert recreate_permissions("demo", NONCE) == {
        "pub": {"allow": [s for stream in streams for s in _api(stream, "INFO", "MSG.GET", "DELETE", "CREATE")]},
        "sub": {"allow": [f"_INBOX_{NONCE}.>"]},
    }


def test_an_issuer_session_lives_at_least_3_s() -> None:
    with pytest.raises(ValueError, match="^the issuer session lives at least 3 s, got 2$"):
        IssuerSession(None, "nats://127.0.0.1:1", lifetime_s=2, clock=lambda: 0.0, reconnect=False)  # type: ignore[arg-type]
