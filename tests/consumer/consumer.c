/* A program built outside the source tree against an installed h2o, the way a user builds one
 * (scripts/test-install.sh builds it with CMake and with pkg-config, shared and static).
 * Generates a few greedy tokens and prints them; fails when the library does not match the
 * header or no text comes out.
 *
 *   h2o-consumer MODEL.gguf
 */
#include <stdio.h>
#include <string.h>

#include "h2o/h2o.h"

static int print_text(const char *text, size_t length, void *user_data) {
    size_t *total = user_data;
    *total += length;
    fwrite(text, 1, length, stdout);
    return 0;
}

int main(int argc, char **argv) {
    static const char prompt[] = "Once upon a time";
    h2o_model *model = NULL;
    h2o_session *session = NULL;
    h2o_session_params sp;
    h2o_generate_params gen;
    h2o_status status;
    size_t generated = 0;

    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
        return 2;
    }
    if (h2o_version_number() != H2O_VERSION_NUMBER) {
        fprintf(stderr, "library %s does not match the header (%d)\n", h2o_version(), H2O_VERSION_NUMBER);
        return 1;
    }
    if (h2o_model_load(argv[1], NULL, &model) != H2O_OK) {
        fprintf(stderr, "load failed: %s\n", h2o_last_error());
        return 1;
    }
    h2o_session_params_init(&sp, sizeof sp);
    sp.backend = H2O_BACKEND_CPU; /* the same text from every build, whatever devices there are */
    if (h2o_session_create(model, &sp, &session) != H2O_OK) {
        fprintf(stderr, "session failed: %s\n", h2o_last_error());
        h2o_model_free(model);
        return 1;
    }
    h2o_generate_params_init(&gen, sizeof gen);
    gen.max_tokens = 16;
    gen.temperature = 0.0f; /* greedy */
    status = h2o_generate(session, prompt, strlen(prompt), &gen, print_text, &generated);
    printf("\n");
    if (status != H2O_OK) fprintf(stderr, "generate failed: %s\n", h2o_session_last_error(session));
    h2o_session_free(session);
    h2o_model_free(model);
    if (status == H2O_OK && generated == 0) fprintf(stderr, "no text was generated\n");
    return status == H2O_OK && generated > 0 ? 0 : 1;
}
