/* Loads a session snapshot in a process of its own and prints what the session generates next:
 * test_session_state.cpp compares it with the saving process's own continuation.
 *
 *   h2o-snapshot-continue MODEL SNAPSHOT N_TOKENS TEMPERATURE */
#include <stdio.h>
#include <stdlib.h>

#include "h2o/h2o.h"

static int print(const char *text, size_t length, void *user_data) {
    (void)user_data;
    fwrite(text, 1, length, stdout);
    return 0;
}

int main(int argc, char **argv) {
    h2o_model *model = NULL;
    h2o_session *session = NULL;
    h2o_generate_params gen;
    if (argc != 5) {
        fprintf(stderr, "usage: %s MODEL SNAPSHOT N_TOKENS TEMPERATURE\n", argv[0]);
        return 2;
    }
    if (h2o_model_load(argv[1], NULL, &model) != H2O_OK || h2o_session_load(model, argv[2], NULL, &session) != H2O_OK) {
        fprintf(stderr, "%s\n", h2o_last_error());
        return 1;
    }
    h2o_generate_params_init(&gen, sizeof gen);
    gen.max_tokens = (uint32_t)strtoul(argv[3], NULL, 10);
    gen.temperature = (float)atof(argv[4]);
    gen.stop_at_eos = 0;
    gen.repeat_penalty = 1.1f; /* as the test's generations */
    if (h2o_generate(session, "", 0, &gen, print, NULL) != H2O_OK) {
        fprintf(stderr, "%s\n", h2o_session_last_error(session));
        return 1;
    }
    h2o_session_free(session);
    h2o_model_free(model);
    return 0;
}
