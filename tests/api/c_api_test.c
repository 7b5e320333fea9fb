/* A C99 translation unit using the public header: proves the header is plain C, and exercises
 * the ABI from C (defaults, misuse, and a short generation when the model is available). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "h2o/h2o.h"

static int failures = 0;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            ++failures;                                                              \
        }                                                                            \
    } while (0)

static int count_text(const char *text, size_t length, void *user_data) {
    (void)text;
    *(size_t *)user_data += length;
    return 0;
}

int main(int argc, char **argv) {
    h2o_model *model = NULL;
    h2o_session *session = NULL;
    h2o_generate_params gen;
    h2o_generate_params_init(&gen, sizeof gen);
    h2o_session_params sp;
    h2o_session_params_init(&sp, sizeof sp);
    const char *model_path = getenv("H2O_MODEL");
    FILE *probe;
    size_t produced = 0;

    CHECK(h2o_version_number() == H2O_VERSION_NUMBER);
    CHECK(strlen(h2o_version()) >= 5);
    CHECK(strcmp(h2o_status_string(H2O_OK), "ok") == 0);
    CHECK(h2o_model_load(NULL, NULL, &model) == H2O_ERR_INVALID_ARGUMENT);
    CHECK(strlen(h2o_last_error()) > 0);
    CHECK(h2o_generate(NULL, "x", 1, &gen, NULL, NULL) == H2O_ERR_INVALID_ARGUMENT);
    h2o_model_free(NULL);
    h2o_session_free(NULL);
    CHECK(gen.struct_size == sizeof(gen));
    CHECK(sp.struct_size == sizeof(sp));

    if (argc > 1) model_path = argv[1];
    probe = model_path ? fopen(model_path, "rb") : NULL;
    if (!probe) {
        printf("H2O-SKIP: model not found (pass its path or set H2O_MODEL); ran the checks without a model\n");
        return failures ? 1 : 0;
    }
    fclose(probe);
    CHECK(h2o_model_load(model_path, NULL, &model) == H2O_OK);
    if (model) {
        sp.n_threads = 1;
        CHECK(h2o_session_create(model, &sp, &session) == H2O_OK);
        gen.max_tokens = 16;
        gen.temperature = 0.0f;
        /* The session keeps the model alive: freeing the model first is allowed. */
        h2o_model_free(model);
        CHECK(h2o_generate(session, "Once upon a time", 16, &gen, count_text, &produced) == H2O_OK);
        CHECK(produced > 0);
        h2o_session_free(session);
    }
    printf("c api checks: %d failures\n", failures);
    return failures ? 1 : 0;
}
