// What tool_parser.c (the API: names, life, feeding, JSON) and tool_parser_steps.c (the state
// machine over each family's format) share. Not a public header.
#ifndef KAON_SERVER_TOOL_PARSER_INTERNAL_H
#define KAON_SERVER_TOOL_PARSER_INTERNAL_H

#include "server/json_scan.h"
#include "server/tool_parser.h"

enum {
    S_TEXT,           // content, looking for a family's start marker
    S_OBJ,            // a {"name": ..., "arguments": ...} object (sub-state j)
    S_ARGS_START,     // a call's name is known: its arguments' value begins next
    S_ARGS,           // the arguments' JSON value, passed on as it comes
    S_HERMES_END,     // </tool_call>
    S_LLAMA_NEXT,     // ';' and another object, or the end of the calls
    S_MISTRAL_OPEN,   // after [TOOL_CALLS]: '[' (JSON list) or a name (name[ARGS]{...})
    S_MISTRAL_NAME,
    S_MISTRAL_NEXT,   // ',' and another object, or ']'
    S_DS_SECTION,     // a call's begin, or the section's end
    S_DS_HEAD,        // "function" (V3) or the name (V3.1), up to the tool separator
    S_DS_AFTER_SEP,
    S_DS_NAME,        // V3: the name, up to a newline
    S_DS_FENCE,       // V3: ```json
    S_DS_FENCE_END,   // V3: ```
    S_DS_CALL_END,
    S_KIMI_SECTION,
    S_KIMI_HEAD,      // functions.NAME:IDX, up to the argument marker
    S_KIMI_CALL_END,
    S_CALL_DONE,      // a call ended: back to content, whitespace dropped
};

enum { J_OPEN, J_KEY, J_COLON, J_VALUE, J_SKIP, J_NEXT };

#define DS_CALLS_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALLS_END "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_CALL_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALL_END "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_SEP "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>"

typedef struct tool_call {
    char *id, *name;
    kaon_sbuf args;
    size_t sent;        // argument bytes already in a delta
    bool announced;     // the delta with id and name has gone out
} tool_call;

struct kaon_tool_parser {
    kaon_tool_family fam;
    char *id_prefix;
    kaon_sbuf buf;          // everything fed so far
    size_t pos;             // bytes consumed
    bool final, at_start, after_call, oom;
    int state, after;       // after: the state once the current arguments end
    size_t attempt;         // where the current attempt began (given back as content on failure)
    bool committed;         // a call was made since the attempt began
    int after_obj;          // the state after a JSON call object
    kaon_sbuf *out;         // the content of this feed
    // The JSON call object being read.
    int j;
    char *key, *pending_name, *pending_id;
    bool obj_committed, skip_is_args, have_args;
    size_t skip_from, args_from, args_to;
    kaon_json_scan v;
    tool_call *calls;
    int n, cap;
};

// One step of the state machine: 1 when it consumed bytes or changed state (call again), 0 when
// it needs more text (or, after the end, has nothing left).
int kaon_tool_parser_step(kaon_tool_parser *p);

#endif
