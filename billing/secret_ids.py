"""Recognising a secret sent where a public id belongs (``api_key_id``, ``upstream_account``).

A gateway must never send a provider's secret key or this service's own bearer token as an id:
the id is stored, shown in ``GET /v1/calls`` and written to the finance CSVs. ``looks_like_secret``
reads the value as a person would paste it: Unicode compatibility forms folded (NFKC: a
full-width ``ｓｋ－`` is ``sk-``), the hyphen look-alikes (U+2010–U+2014, U+2212) read as ``-``,
invisible format characters dropped, surrounding spaces and quotes trimmed, case folded, and a
leading ``Bearer `` or ``key:`` taken off, then compares it with the documented shapes of the
providers' keys and of JSON Web Tokens, at its start or after a prefix or a space
(``prod:sk-…``, ``my key sk-…``).
"""

from __future__ import annotations

import re
import unicodedata

#: The prefix of this service's own bearer tokens (``billing.auth.tokens`` makes them).
TOKEN_PREFIX = "bt_"


#: Prefixes of secret keys (case-folded): OpenAI ``sk-``/``sk-proj-``, Anthropic ``sk-ant-``,
#: Stripe secret and restricted keys ``sk_live_``/``sk_test_``/``rk_live_``/``rk_test_`` and
#: webhook secrets ``whsec_``, Groq ``gsk_``, xAI ``xai-``, GitHub tokens (``ghp_`` personal,
#: ``gho_`` OAuth, ``ghu_``/``ghs_`` app, ``ghr_`` refresh, ``github_pat_`` fine-grained), Slack
#: ``xoxb-``/``xoxp-``.
SECRET_PREFIXES = (
    "sk-",
    "sk_",
    "rk_live_",
    "rk_test_",
    "whsec_",
    "gsk_",
    "xai-",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "xoxb-",
    "xoxp-",
)
#: Secrets recognised by their whole shape (case-folded), where the prefix alone is also the
#: start of ordinary words: Google API keys (``AIza`` and 35 characters; 30 are enough), AWS
#: access key ids (``AKIA``/``ASIA`` and 16 letters or digits), this service's bearer tokens
#: (``bt_`` and the ``secrets.token_urlsafe`` text, of which 16 characters are a secret's share),
#: Hugging Face ``hf_``, GitLab ``glpat-``, Perplexity ``pplx-`` and Replicate ``r8_`` tokens
#: (16 characters after the prefix are enough), and JSON Web Tokens (``eyJ…`` header and payload:
#: base64url of ``{"``).
_SHAPES = (
    r"aiza[0-9a-z_-]{30,}|a[ks]ia[0-9a-z]{16}|"
    + re.escape(TOKEN_PREFIX)
    + r"[0-9a-z_-]{16,}|(?:hf_|glpat-|pplx-|r8_)[0-9a-z_-]{16,}|"
    r"eyj[0-9a-z_-]{4,}\.eyj[0-9a-z_-]{4,}\.[0-9a-z_-]*"
)
SECRET_SHAPES = re.compile(_SHAPES, re.ASCII)
#: A secret after a prefix or a space (``prod:sk-…``, ``key sk-…``): a prefix of
#: ``SECRET_PREFIXES`` with 16 characters of a key after it, or a shape of ``SECRET_SHAPES``, at
#: the start of a word (after a character that is not a letter or digit).
_EMBEDDED = re.compile(
    r"(?<![0-9a-z])(?:(?:"
    + "|".join(map(re.escape, SECRET_PREFIXES))
    + r")[0-9a-z_-]{16,}|"
    + _SHAPES
    + ")",
    re.ASCII,
)
#: The hyphen look-alikes NFKC leaves as they are, read as ``-``.
_DASHES = str.maketrans(dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2212", "-"))
#: What a pasted value may carry before the secret itself (after case folding).
_WRAPPERS = re.compile(r"^(?:bearer\s*[:=]?|key\s*[:=]|api[-_ ]?key\s*[:=]|token\s*[:=])\s*")
_QUOTES = "\"'`"


def canonical(value: str) -> str:
    """``value`` as compared with the secret shapes: NFKC, without format characters (zero
    width spaces, joiners, marks of direction), trimmed of spaces and quotes, case-folded,
    without a leading ``Bearer``/``key:``/``api_key=``/``token:`` (repeated ones too)."""
    text = value
    if not value.isascii():  # NFKC leaves ASCII as it is, and no ASCII character is a Cf
        text = unicodedata.normalize("NFKC", value).translate(_DASHES)
        text = "".join(ch for ch in text if unicodedata.category(ch) != "Cf")
    text = text.strip().strip(_QUOTES).strip().casefold()
    while True:
        unwrapped = _WRAPPERS.sub("", text, count=1).strip().strip(_QUOTES).strip()
        if unwrapped == text:
            return text
        text = unwrapped


def looks_like_secret(value: str) -> bool:
    """Whether ``value`` is, starts with or holds after a prefix or a space a provider's secret
    key, a JSON Web Token or one of this service's bearer tokens, read as ``canonical`` reads
    it."""
    text = canonical(value)
    return text.startswith(SECRET_PREFIXES) or _EMBEDDED.search(text) is not None
