"""kaon_regex_to_gbnf against Python's re: for each pattern, every short string over a small
alphabet and random longer ones go through the grammar (tests/regex_check, built with the unit
tests) and must be accepted exactly when re.fullmatch(pattern, s, re.ASCII) matches. Also in
JSON-string mode (the candidate is the JSON-escaped string, the decoded one must match), and
patterns kaon must refuse. Fixed seeds; set KAON_BUILD to the build directory."""
import itertools
import json
import random
import re
import subprocess

import pytest

from conftest import build_dir

# (pattern, alphabet of the candidate strings[, more candidates])
PATTERNS = [
    ("abc", "abc"),
    ("a|b|", "abc"),
    ("a*", "ab"),
    ("a+b?", "ab"),
    ("(ab)*c", "abc"),
    ("a(b|c)*d$", "abcd"),
    ("^(a?b?)*$", "abc"),
    ("(a|)+x", "ax"),
    ("(a*b*)+c", "abc"),
    ("((a?)(b?))*c?", "abc"),
    ("(?:a|bc)+", "abc"),
    ("(?P<x>a)(?<y>b+)", "abc"),
    ("a{3}", "ab"),
    ("a{2,}", "ab"),
    ("a{1,3}b{0,2}", "ab"),
    ("a{,2}b", "ab"),
    ("(ab|a){2,3}", "ab"),
    ("(a?){2,4}b", "ab"),
    ("(a?){2,}b", "ab"),
    ("(a?b?){0,3}", "abc"),
    ("a*?b+?c??", "abc"),
    ("a{1,2}?", "a"),
    ("[a-c]+", "abcd"),
    ("[^a]*", "ab\n"),
    ("[]a]+", "a]b"),
    ("[a-]+", "a-b"),
    ("[-a]x", "a-x"),
    ("[\\d_]+", "1_a"),
    ("\\d+", "12a"),
    ("\\D\\w\\W", "a1 _-"),
    ("\\s\\S", " \ta\n"),
    ("[\\s\\d]+", " 1a\t"),
    ("[^\\d\\s]", "1 a\t"),
    (".+", "a\nb"),
    ("a.c", "abc\n"),
    ("\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\^\\$\\\\\\/", ".*+?()[]{}|^$\\/", [".*+?()[]{}|^$\\/"]),
    ("a{", "a{"),
    ("a{1,x}", "a{1,x}", ["a{1,x}", "a{1,x", "aa{1,x}"]),
    ("}]", "}]"),
    ("\\x41\\u0042\\n\\t", "AB\n\t"),
    ("[\\x00-\\x1f]+", "\x00\x01\x1f a"),
    ("\\0a", "\x00a"),
    ("é+ü?", "éüa"),
    ("[à-ÿ]+", "àéÿa"),
    ("[^é]", "éa\n"),
    ('a"b', 'a"b\\'),
    ('[\\\\"/]+', '\\"/a'),
    ("^a$|^b$", "abc"),
    ("(a|b)*abb", "ab"),
    ("(0|[1-9][0-9]*)(\\.[0-9]+)?", "01.9"),
    ("[A-Z][a-z]*( [A-Z][a-z]*)*", "Aa b"),
    ("\\d{3}-\\d{4}", "12-"),
    ("(x+x+)+y", "xy"),
    ("()*a()+", "ab"),
    ("(|a)*", "ab"),
]

ERRORS = [
    ("\\bx", "word boundaries"), ("a\\1", "backreferences"), ("(a)\\k<a>", "backreferences"),
    ("(?=a)", "lookahead"), ("(?<=a)b", "lookbehind"), ("(?!a)", "lookahead"), ("(?i)a", "not supported"),
    ("a^b", "start"), ("a$b", "end"), ("(a$)*", "quantified group"), ("(^a)+", "quantified group"),
    ("x(^a)", "start"), ("*a", "nothing to repeat"), ("a**", "multiple repeat"), ("a*+", "possessive"),
    ("a{2}{3}", "multiple repeat"), ("a{3,2}", "min repeat"), ("a{1,1025}", "1024"), ("a{2000}", "1024"),
    ("(a", "missing ')'"), ("a)", "unbalanced"), ("[a", "unterminated"), ("[z-a]", "reversed"),
    ("[\\d-z]", "range"), ("\\p{L}", "property"), ("\\01", "octal"), ("\\q", "unknown escape"),
    ("a\\", "backslash"), ("\\xZZ", "hex"), ("(?P=x)", "backreferences"), ("\\A", "anchor"),
    ("(" * 40 + ")" * 40, "nested"),
]

CASES = [(p[0], p[1], p[2] if len(p) > 2 else []) for p in PATTERNS]


def py_match(pattern, s):
    """Python's answer; (?<name>...) is spelled (?P<name>...) before Python 3.12."""
    return re.fullmatch(re.sub(r"\(\?<(?=[A-Za-z_])", "(?P<", pattern), s, re.ASCII) is not None


def check(pattern, mode, candidates):
    exe = build_dir() / "tests" / "regex_check"
    if not exe.exists():
        pytest.fail(f"{exe} not found: build first (or set KAON_BUILD)")
    stdin = "".join(c.encode().hex() + "\n" for c in candidates)
    r = subprocess.run([str(exe), pattern, mode], input=stdin, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{pattern!r}: {r.stdout}{r.stderr}"
    out = r.stdout.split()
    assert len(out) == len(candidates)
    return [o == "1" for o in out]


def candidates_for(alphabet, seed):
    rng = random.Random(seed)
    strs = ["".join(t) for n in range(6) for t in itertools.product(alphabet, repeat=n)]
    strs = strs[:3000]
    strs += ["".join(rng.choice(alphabet) for _ in range(rng.randint(6, 14))) for _ in range(300)]
    return strs


@pytest.mark.parametrize("pattern,alphabet,extra", CASES, ids=[c[0] for c in CASES])
def test_raw_matches_python_re(pattern, alphabet, extra):
    strs = candidates_for(alphabet, len(pattern) * 7919) + extra
    want = [py_match(pattern, s) for s in strs]
    got = check(pattern, "raw", strs)
    wrong = [(s, w) for s, w, g in zip(strs, want, got) if w != g]
    assert not wrong, f"{pattern!r}: {len(wrong)} disagreements, e.g. {wrong[:5]} (string, python's answer)"
    assert any(want), f"{pattern!r}: no candidate matches, the test proves little"


@pytest.mark.parametrize("pattern,alphabet,extra", CASES, ids=[c[0] for c in CASES])
def test_json_string_matches_python_re(pattern, alphabet, extra):
    strs = candidates_for(alphabet, len(pattern) * 104729) + extra
    texts = [json.dumps(s, ensure_ascii=False)[1:-1] for s in strs]
    want = [py_match(pattern, s) for s in strs]
    # other valid spellings: \/ and upper-case \u00XX hex
    for s, t in zip(strs, texts):
        if "/" in t or "\\u00" in t:
            texts.append(re.sub(r"\\u00([0-9a-f]{2})", lambda m: "\\u00" + m.group(1).upper(),
                                t.replace("/", "\\/")))
            want.append(py_match(pattern, s))
    # a raw '"' or control character is never valid inside a JSON string (a backslash could
    # make the '"' an escape: those strings are left out)
    bad = [s for s in strs if "\\" not in s and any(c == '"' or ord(c) < 0x20 for c in s)]
    got = check(pattern, "json", texts + bad)
    wrong = [(t, w) for t, w, g in zip(texts, want, got) if w != g]
    assert not wrong, f"{pattern!r}: {len(wrong)} disagreements, e.g. {wrong[:5]} (JSON text, python's answer)"
    leaked = [s for s, g in zip(bad, got[len(texts):]) if g]
    assert not leaked, f"{pattern!r}: unescaped text accepted: {leaked[:5]}"


@pytest.mark.parametrize("pattern,why", ERRORS, ids=[p for p, _ in ERRORS])
def test_refused(pattern, why):
    exe = build_dir() / "tests" / "regex_check"
    for mode in ("raw", "json"):
        r = subprocess.run([str(exe), pattern, mode], input="", capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, f"{pattern!r} should be refused: {r.stdout}{r.stderr}"
        assert why in r.stdout and "offset" in r.stdout, r.stdout
