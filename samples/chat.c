/* A multi-turn chat in constant memory: the system prompt is pinned, the cache is bounded and
 * rolls, /save FILE and /load FILE keep a conversation across runs, and Ctrl-C stops the current
 * reply (not the program).
 *
 *   h2o-chat MODEL.gguf [--format llama2|zephyr|chatml|llama3|phi3|mistral] [--system TEXT] [--budget 256]
 *
 * The chat format comes from the model's template unless --format names one. Every option is
 * checked before the model is loaded; a usage error exits with status 2. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "h2o/h2o.h"

static h2o_session *volatile g_session = NULL;

/* Set by the session's event callback when its cache filled; said once, after that reply. */
static int g_cache_filled = 0;

static void on_event(uint32_t event, const h2o_kv_usage *usage, void *user_data) {
    (void)usage;
    (void)user_data;
    if (event == H2O_EVENT_KV_FULL) g_cache_filled = 1;
}

/* One line, the first time the cache is full: from then on the model no longer sees the whole
 * conversation (the pinned system prompt stays). */
static void tell_if_cache_filled(h2o_session *session) {
    h2o_kv_layout layout;
    if (!g_cache_filled) return;
    g_cache_filled = 0;
    layout.struct_size = sizeof layout;
    if (h2o_session_get_kv_layout(session, &layout) != H2O_OK) return;
    printf("[the cache is full: older tokens are now evicted by %s; %u kept]\n", h2o_kv_policy_name(layout.policy), layout.budget);
}

/* Ctrl-C: cancel the reply being generated. h2o_session_cancel is safe in a signal handler. */
static void on_interrupt(int sig) {
    (void)sig;
    if (g_session) h2o_session_cancel(g_session);
}

static const char *const usage_text =
    "usage: h2o-chat MODEL.gguf [--format llama2|zephyr|chatml|llama3|phi3|mistral] [--system TEXT] [--budget N]\n"
    "  --format NAME          chat format (default: the one the model's template describes)\n"
    "  --system TEXT          system prompt, pinned (default: \"You are a helpful assistant.\")\n"
    "  --budget N             KV slots per layer and kv head, at least 2 (default 256); the cache rolls\n"
    "  --version              print the library's version\n";

/* A usage error: one line (printf's format and arguments), exit status 2. */
static int usage_error(const char *format, ...) {
    va_list args;
    fputs("h2o-chat: ", stderr);
    va_start(args, format);
    vfprintf(stderr, format, args);
    va_end(args);
    fputs(" (see --help)\n", stderr);
    return 2;
}

/* The formats h2o_chat_format knows by name, as the usage text lists them. */
static const char *const chat_formats[] = {"llama2", "zephyr", "chatml", "llama3"};

static int is_chat_format(const char *name) {
    for (size_t i = 0; i < sizeof chat_formats / sizeof chat_formats[0]; ++i) {
        if (strcmp(name, chat_formats[i]) == 0) return 1;
    }
    return 0;
}

/* A whole number from 2 to 2^22 (the longest context), digits only. */
static int parse_budget(const char *text, uint32_t *out) {
    char *end = NULL;
    unsigned long v;
    if (*text < '0' || *text > '9') return 0;
    v = strtoul(text, &end, 10);
    if (*end != '\0' || v < 2 || v > (1ul << 22)) return 0;
    *out = (uint32_t)v;
    return 1;
}

static int print_piece(const char *text, size_t length, void *user_data) {
    (void)user_data;
    fwrite(text, 1, length, stdout);
    fflush(stdout);
    return 0;
}

/* Formats one message (and the assistant's opening when asked) and adds it to the session. */
static h2o_status add_message(h2o_model *model, h2o_session *session, const char *format, const char *role, const char *content,
                              int open_reply, uint32_t flags) {
    h2o_chat_message message;
    size_t needed = 0;
    char *text;
    h2o_status status;
    message.role = role;
    message.role_len = strlen(role);
    message.content = content;
    message.content_len = strlen(content);
    status = h2o_chat_format(model, format, &message, 1, open_reply, NULL, 0, &needed);
    if (status != H2O_OK && status != H2O_ERR_BUFFER_TOO_SMALL) return status;
    text = malloc(needed + 1);
    if (!text) return H2O_ERR_OUT_OF_MEMORY;
    status = h2o_chat_format(model, format, &message, 1, open_reply, text, needed + 1, &needed);
    if (status == H2O_OK) status = h2o_session_add_text(session, text, needed, flags | H2O_TEXT_SPECIAL);
    free(text);
    return status;
}

int main(int argc, char **argv) {
    const char *format = NULL, *system = "You are a helpful assistant.", *model_path = NULL;
    h2o_model *model = NULL;
    h2o_session *session = NULL;
    h2o_session_params sp;
    h2o_generate_params gen;
    char line[4096];
    int i;

    h2o_session_params_init(&sp, sizeof sp);
    h2o_generate_params_init(&gen, sizeof gen);
    sp.kv_budget = 256; /* a small cache; like every session's, it evicts when full and never runs out */
    gen.max_tokens = 256;
    for (i = 1; i < argc; ++i) {
        const char *arg = argv[i];
        const int takes_value = strcmp(arg, "--format") == 0 || strcmp(arg, "--system") == 0 || strcmp(arg, "--budget") == 0;
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            fputs(usage_text, stdout);
            return 0;
        }
        if (strcmp(arg, "--version") == 0) {
            printf("h2o-chat %s\n", h2o_version());
            return 0;
        }
        if (takes_value && i + 1 == argc) return usage_error("%s needs a value", arg);
        if (strcmp(arg, "--format") == 0) {
            format = argv[++i];
            if (!is_chat_format(format)) {
                char known[64] = "";
                for (size_t k = 0; k < sizeof chat_formats / sizeof chat_formats[0]; ++k) {
                    strcat(strcat(known, k ? ", " : ""), chat_formats[k]);
                }
                return usage_error("unknown chat format '%s' (known: %s)", format, known);
            }
        } else if (strcmp(arg, "--system") == 0) {
            system = argv[++i];
        } else if (strcmp(arg, "--budget") == 0) {
            if (!parse_budget(argv[++i], &sp.kv_budget))
                return usage_error("--budget needs a whole number from 2 to 4194304, not '%s'", argv[i]);
        } else if (arg[0] == '-' && arg[1] != '\0') {
            return usage_error("unknown option '%s'", arg);
        } else if (model_path) {
            return usage_error("unexpected argument '%s'", arg);
        } else {
            model_path = arg;
        }
    }
    if (!model_path) return usage_error("no model given: h2o-chat MODEL.gguf");
    if (h2o_model_load(model_path, NULL, &model) != H2O_OK || h2o_session_create(model, &sp, &session) != H2O_OK) {
        fprintf(stderr, "%s\n", h2o_last_error());
        h2o_model_free(model);
        return 1;
    }
    if (!format) {
        /* The format of the model's own template; a model without one stops at the system
         * message below, with the reason. */
        size_t n = 0;
        if (h2o_model_get_text(model, H2O_MODEL_TEXT_CHAT_FORMAT, line, sizeof line, &n) == H2O_OK) {
            fprintf(stderr, "h2o-chat: chat format %s, from the model's template\n", line);
        }
    }
    /* The system prompt is pinned: eviction never drops it, however long the chat. */
    if (add_message(model, session, format, "system", system, 0, H2O_TEXT_PIN) != H2O_OK) {
        fprintf(stderr, "%s\n", h2o_session_last_error(session)[0] ? h2o_session_last_error(session) : h2o_last_error());
        return 1;
    }
    g_session = session;
    h2o_session_set_event_callback(session, on_event, NULL);
    signal(SIGINT, on_interrupt);
    printf("Type a message; /save FILE, /load FILE, /quit. Ctrl-C stops a reply.\n");
    for (;;) {
        size_t len;
        h2o_status status;
        printf("> ");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin)) break;
        len = strlen(line);
        if (len && line[len - 1] == '\n') line[--len] = '\0';
        if (strcmp(line, "/quit") == 0) break;
        if (strncmp(line, "/save ", 6) == 0) {
            status = h2o_session_save(session, line + 6);
            printf("%s\n", status == H2O_OK ? "saved" : h2o_session_last_error(session));
            continue;
        }
        if (strncmp(line, "/load ", 6) == 0) {
            h2o_session *loaded = NULL;
            if (h2o_session_load(model, line + 6, &sp, &loaded) != H2O_OK) {
                printf("%s\n", h2o_last_error());
                continue;
            }
            g_session = loaded;
            h2o_session_free(session);
            session = loaded;
            h2o_session_set_event_callback(session, on_event, NULL); /* a loaded cache that had filled says nothing */
            printf("loaded\n");
            continue;
        }
        status = add_message(model, session, format, "user", line, 1, 0);
        if (status == H2O_OK) status = h2o_generate(session, "", 0, &gen, print_piece, NULL);
        if (status == H2O_ERR_CANCELLED)
            printf(" [stopped]");
        else if (status != H2O_OK)
            printf("\n%s", h2o_session_last_error(session));
        printf("\n");
        tell_if_cache_filled(session);
    }
    g_session = NULL;
    h2o_session_free(session);
    h2o_model_free(model);
    return 0;
}
