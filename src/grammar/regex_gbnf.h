// Regular expressions (the subset structured outputs use: JSON Schema `pattern`, vLLM's
// `regex`) turned into GBNF rules.
//
// Matching is always of the whole string: a pattern is anchored at both ends. JSON Schema's
// `pattern` is formally a search (unanchored), but the structured-output engines (vLLM,
// xgrammar, OpenAI's) constrain the whole string to it, and an unanchored pattern would let a
// model write anything around the match. `^` (at the start) and `$` (at the end, of the pattern
// or of its top-level alternatives) are accepted and change nothing.
//
// Supported: literals (UTF-8 code points), escapes \. \\ \/ \- \n \t \r \f \v \a \0 \xHH
// \uHHHH \u{H..} \UHHHHHHHH and escaped punctuation, `.` (any code point but \n), classes
// [a-z0-9_] and [^...] (a leading ']' is literal, \b inside is backspace), \d \w (ASCII, as
// ECMAScript and Python's re.ASCII) and \s (ECMAScript's white space), their negations \D \W
// \S in and out of classes, `|`, ( ), (?: ), (?P<name> ), (?<name> ), * + ? {m} {m,} {m,n}
// {,n} (a '{' that is no quantifier is literal, as in Python) and the lazy forms *? +? ?? {m,n}?
// (the same strings). Refused with an error naming the offset: \b \B, backreferences,
// lookaround, inline flags, possessive quantifiers (they change the language), \p{..}, octal
// escapes, '^' / '$' anywhere else, a quantified group holding an anchor, and counts above
// KAON_GRAMMAR_MAX_REPEAT (1024; {m,n} with larger n is an error, not silently unbounded).
// In json_string mode a character may be written raw (when JSON allows it), with its short
// escape (\" \\ \/ \b \f \n \r \t), or as \u00XX (controls only, hex in either case);
// \uXXXX for other characters and surrogate pairs are not accepted.
#ifndef KAON_GRAMMAR_REGEX_GBNF_H
#define KAON_GRAMMAR_REGEX_GBNF_H

#include <stdbool.h>
#include <stddef.h>

#include "grammar/gbnf_text.h"

// Limits on hostile patterns: bytes, group nesting (the GBNF text is capped at
// KAON_GRAMMAR_MAX_TEXT).
#define KAON_REGEX_MAX_LEN (16 * 1024)
#define KAON_REGEX_MAX_DEPTH 24

// Appends to `out` the rule `name` (and helper rules named `name`-...) matching exactly the
// strings the regex re[0..len) fully matches (a leading ^ and trailing $ are accepted and
// change nothing; a pattern is anchored at both ends as vLLM's `regex` is). With json_string
// the rule matches the JSON-escaped form of those strings instead (what appears between the
// quotes of a JSON string: '"', '\' and control characters escaped). Returns 0, or -1 with
// kaon_last_error() naming the unsupported construct and its offset (backreferences,
// lookaround, ...).
int kaon_regex_to_gbnf(const char *re, size_t len, const char *name, bool json_string,
                       gbnf_text *out);

#endif
