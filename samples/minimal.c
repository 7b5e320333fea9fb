/* The smallest useful embedding of h2o: load a model, generate greedily, print as it streams.
 *
 *   h2o-minimal MODEL.gguf "Once upon a time"
 */
#include <stdio.h>
#include <string.h>

#include "h2o/h2o.h"

static int print_text(const char *text, size_t length, void *user_data) {
    (void)user_data;
    fwrite(text, 1, length, stdout);
    fflush(stdout);
    return 0; /* non-zero would stop generation */
}

int main(int argc, char **argv) {
    h2o_model *model = NULL;
    h2o_session *session = NULL;
    h2o_generate_params gen;
    h2o_status status;

    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT\n", argv[0]);
        return 2;
    }
    status = h2o_model_load(argv[1], NULL, &model);
    if (status != H2O_OK) {
        fprintf(stderr, "load failed: %s\n", h2o_last_error());
        return 1;
    }
    status = h2o_session_create(model, NULL, &session);
    if (status != H2O_OK) {
        fprintf(stderr, "session failed: %s\n", h2o_last_error());
        h2o_model_free(model);
        return 1;
    }
    h2o_generate_params_init(&gen, sizeof gen);
    gen.max_tokens = 64;
    gen.temperature = 0.0f; /* greedy */
    printf("%s", argv[2]);
    status = h2o_generate(session, argv[2], strlen(argv[2]), &gen, print_text, NULL);
    printf("\n");
    if (status != H2O_OK) fprintf(stderr, "generate failed: %s\n", h2o_session_last_error(session));
    h2o_session_free(session);
    h2o_model_free(model);
    return status == H2O_OK ? 0 : 1;
}
