"""The door's canonical path (gateway.paths): every spelling resolved to one form, or
refused; pass-through patterns; segments encoded under an upstream's base path."""

from __future__ import annotations

import pytest

from gateway.config import load_config
from gateway.errors import ConfigError
from gateway.paths import BadPath, Pattern, canonical_path, encode_segments, segments_of


@pytest.mark.parametrize(("raw", "canonical"), [
    (b"/v1/chat/completions", "/v1/chat/completions"),
    (b"/v1/./chat/completions", "/v1/chat/completions"),
    (b"/v1/%2E/chat/completions", "/v1/chat/completions"),
    (b"/v1/%2e%2E/v1/chat/completions", "/v1/chat/completions"),
    (b"/v1//chat///completions//", "/v1/chat/completions"),
    (b"/v1/chat%2Fcompletions", "/v1/chat/completions"),
    (b"/v1/models/../chat/completions?x=1", "/v1/chat/completions"),
    (b"/v1/files/caf%C3%A9", "/v1/files/caf\u00e9"),
    (b"/v1/files/a%20b", "/v1/files/a b"),
    (b"/", "/"), (b"//./", "/"), (b"/.well-known/x", "/.well-known/x"),
])
def test_each_spelling_has_one_canonical_form(raw: bytes, canonical: str) -> None:
    assert canonical_path(raw.partition(b"?")[0], "") == canonical


@pytest.mark.parametrize("raw", [
    b"/v1/../../internal/admin", b"/v1/..%2F..%2Finternal/admin", b"/..", b"/%2e%2e/x",
    b"/v1/a%5Cb", b"/v1/a\\b", b"/v1/%252e%252e/x", b"/v1/%zz", b"/v1/%00", b"/v1/a%0Ab",
    b"/v1/%FF", b"v1/chat/completions", b"*",
])
def test_a_path_without_a_canonical_form_is_refused(raw: bytes) -> None:
    with pytest.raises(BadPath) as caught:
        canonical_path(raw, "")
    assert (caught.value.status, caught.value.code) == (400, "invalid_path")


def test_without_a_raw_path_the_decoded_one_is_used() -> None:
    assert canonical_path(None, "/v1/./chat//completions/") == "/v1/chat/completions"
    with pytest.raises(BadPath):
        canonical_path(None, "/v1/%2F")  # a '%' left: decoded twice would differ


def test_segments_are_encoded_so_none_adds_a_slash_query_or_fragment() -> None:
    assert segments_of("/v1/files/x") == ["v1", "files", "x"]
    assert segments_of("/") == []
    assert encode_segments(["files", "a/b", "c?d", "e#f", "g h", "..x"]) == \
        "/files/a%2Fb/c%3Fd/e%23f/g%20h/..x"


@pytest.mark.parametrize(("pattern", "path", "matches"), [
    ("/v1/moderations", "/v1/moderations", True),
    ("/v1/moderations", "/v1/moderations/x", False),
    ("/v1/files/**", "/v1/files", True),
    ("/v1/files/**", "/v1/files/f/content", True),
    ("/v1/files/**", "/v1/filesx", False),
    ("/v1/vector_stores/*/search", "/v1/vector_stores/vs_1/search", True),
    ("/v1/vector_stores/*/search", "/v1/vector_stores/search", False),
])
def test_patterns_match_by_segment(pattern: str, path: str, matches: bool) -> None:
    assert Pattern(pattern).matches(segments_of(path)) is matches


@pytest.mark.parametrize("pattern", [
    "/v1/**", "/v1/*/x", "/v1/responses/**", "/v1/messages/batches", "/v1/models",
    "/v1/embeddings", "/v1/files/a*", "/v1/files/**/x", "/v2/x", "files", "/v1//x",
    "/v1/../x", "/v1/x?y", "/v1/a%2Fb",
])
def test_an_allow_list_entry_that_is_not_a_narrow_pattern_is_a_config_error(
        tmp_path, pattern: str) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(f'[upstreams.up]\ntype = "openai"\nbase_url = "http://x/v1"\n'
                    f'passthrough = ["{pattern}"]\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert ": upstreams.up: pass-through pattern" in str(caught.value)


@pytest.mark.parametrize(("extra", "message"), [
    ('type = "anthropic"\npassthrough = ["/v1/files/**"]', "applies to type 'openai'"),
    ('type = "openai"\nbase_url = "http://x/v1"\nforward_headers = ["Authorization"]',
     "is never forwarded"),
    ('type = "openai"\nbase_url = "http://x/v1"\nforward_headers = ["x-forwarded-*"]',
     "is never forwarded"),
    ('type = "openai"\nbase_url = "http://x/v1"\nforward_headers = ["x-*"]',
     "is never forwarded"),
    ('type = "openai"\nbase_url = "http://x/v1"\nforward_headers = ["*"]',
     "not a header name"),
])
def test_upstream_header_and_pass_through_settings_are_checked_at_load(
        tmp_path, extra: str, message: str) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(f"[upstreams.up]\n{extra}\n")
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_default_allow_lists_stateless_paths_for_openai_upstreams_only(tmp_path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text('[upstreams.o]\ntype = "openai"\nbase_url = "http://x/v1"\n'
                    '[upstreams.a]\ntype = "anthropic"\n')
    config = load_config(path)
    allowed = config.upstreams["o"].passthrough or ()
    assert "/v1/moderations" in allowed and "/v1/audio/speech" in allowed
    assert not any(p.startswith(("/v1/files", "/v1/batches", "/v1/chat")) for p in allowed)
    assert config.upstreams["a"].passthrough == ()
