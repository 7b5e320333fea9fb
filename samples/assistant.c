/* A long-running, constant-memory generator: the shape of an on-device assistant that talks for
 * days. It keeps one session with a bounded KV cache (heavy-hitter eviction + position rolling),
 * pins its instructions so eviction never drops them, and generates until interrupted (Ctrl-C) or
 * until --tokens N, reporting speed and resident memory every --every tokens on stderr.
 *
 *   h2o-assistant MODEL.gguf [--budget 128] [--policy h2o|window|sink_window|...] [--tokens N]
 *                 [--every 1000] [--quiet]
 */
#include <signal.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__unix__)
#include <unistd.h>
#endif

#include "h2o/h2o.h"

static volatile sig_atomic_t interrupted = 0;

static void on_signal(int sig) {
    (void)sig;
    interrupted = 1;
}

static int on_text(const char *text, size_t length, void *user_data) {
    const int *quiet = (const int *)user_data;
    if (!*quiet) {
        fwrite(text, 1, length, stdout);
        fflush(stdout);
    }
    return interrupted; /* non-zero stops generation */
}

/* Resident memory in MiB (Linux), or -1 where unknown. */
static double resident_mib(void) {
#if defined(__linux__)
    unsigned long total = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return -1;
    if (fscanf(f, "%lu %lu", &total, &resident) != 2) resident = 0;
    fclose(f);
    return (double)resident * (double)sysconf(_SC_PAGESIZE) / 1048576.0;
#else
    return -1;
#endif
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A whole number in [min, max], with nothing after it. */
static int parse_count(const char *text, unsigned long long min, unsigned long long max, unsigned long long *out) {
    char *end = NULL;
    unsigned long long v;
    if (*text < '0' || *text > '9') return 0;
    errno = 0;
    v = strtoull(text, &end, 10);
    if (*end != '\0' || errno == ERANGE || v < min || v > max) return 0;
    *out = v;
    return 1;
}

static int usage_error(const char *option, const char *value) {
    fprintf(stderr, "%s: '%s' is not a valid count\n", option, value);
    return 2;
}

int main(int argc, char **argv) {
    h2o_model *model = NULL;
    h2o_session *session = NULL;
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    unsigned long long limit = 0, every = 1000, produced = 0, value = 0;
    double max_rss_first = 0, max_rss_rest = 0, start;
    int quiet = 0, i;
    const char *pinned = "Once upon a time, there was a kind cat named Tom.";

    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [--budget 128] [--policy NAME] [--tokens N] [--every 1000] [--quiet]\n", argv[0]);
        return 2;
    }
    sp.kv_budget = 128;
    sp.position_rolling = 1;
    for (i = 2; i < argc; ++i) {
        if (strcmp(argv[i], "--quiet") == 0) {
            quiet = 1;
        } else if (i + 1 < argc && strcmp(argv[i], "--budget") == 0) {
            if (!parse_count(argv[++i], 2, 1u << 22, &value)) return usage_error("--budget", argv[i]);
            sp.kv_budget = (uint32_t)value;
        } else if (i + 1 < argc && strcmp(argv[i], "--tokens") == 0) {
            if (!parse_count(argv[++i], 1, ULLONG_MAX, &limit)) return usage_error("--tokens", argv[i]);
        } else if (i + 1 < argc && strcmp(argv[i], "--every") == 0) {
            if (!parse_count(argv[++i], 1, UINT32_MAX, &every)) return usage_error("--every", argv[i]);
        } else if (i + 1 < argc && strcmp(argv[i], "--policy") == 0) {
            if (h2o_kv_policy_from_name(argv[++i], &sp.kv_policy) != H2O_OK) {
                fprintf(stderr, "%s\n", h2o_last_error());
                return 2;
            }
        } else {
            fprintf(stderr, "unknown option %s\n", argv[i]);
            return 2;
        }
    }

    if (h2o_model_load(argv[1], NULL, &model) != H2O_OK) {
        fprintf(stderr, "load failed: %s\n", h2o_last_error());
        return 1;
    }
    if (h2o_session_create(model, &sp, &session) != H2O_OK) {
        fprintf(stderr, "session failed: %s\n", h2o_last_error());
        h2o_model_free(model);
        return 1;
    }
    h2o_model_free(model); /* the session keeps the model alive */
    /* The instructions are pinned: however long the conversation, eviction never drops them. */
    if (h2o_session_add_text(session, pinned, strlen(pinned), H2O_TEXT_PIN) != H2O_OK) {
        fprintf(stderr, "pin failed: %s\n", h2o_session_last_error(session));
        return 1;
    }
    signal(SIGINT, on_signal);
    gen.stop_at_eos = 0; /* a story ends, the stream goes on */
    start = now_seconds();
    while (!interrupted && (limit == 0 || produced < limit)) {
        double t0 = now_seconds(), rss;
        h2o_generate_stats stats;
        gen.max_tokens = (uint32_t)(limit && limit - produced < every ? limit - produced : every);
        if (h2o_generate(session, "", 0, &gen, on_text, &quiet) != H2O_OK) {
            fprintf(stderr, "\ngenerate failed: %s\n", h2o_session_last_error(session));
            break;
        }
        stats.struct_size = sizeof(stats);
        h2o_session_get_stats(session, &stats);
        produced += stats.n_generated_tokens;
        rss = resident_mib();
        /* The first tenth of a bounded run (the first 10 000 tokens of an endless one) is the
         * warm-up that the rest is compared with. */
        if (produced <= (limit ? (limit / 10 > every ? limit / 10 : every) : 10000)) {
            if (rss > max_rss_first) max_rss_first = rss;
        } else if (rss > max_rss_rest) {
            max_rss_rest = rss;
        }
        fprintf(stderr, "\n[tokens %llu | %.1f tok/s | resident %.2f MiB]\n", produced, stats.n_generated_tokens / (now_seconds() - t0),
                rss);
    }
    fprintf(stderr,
            "generated %llu tokens in %.1f s; max resident over the first tenth %.3f MiB, over the rest %.3f MiB (growth %.3f MiB)\n",
            produced, now_seconds() - start, max_rss_first, max_rss_rest, max_rss_rest > 0 ? max_rss_rest - max_rss_first : 0.0);
    h2o_session_free(session);
    return 0;
}
