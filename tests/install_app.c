/* An app built against the installed library, as a user builds one:
 *     cc install_app.c $(pkg-config --cflags --libs ctxstore)
 * tests/test_install.sh compiles it against the ctxstore.pc of a
 * `meson install` and runs it. Only the public header, only public calls:
 * it creates a session, commits three tokens, reopens it and reads one back.
 * Usage: install_app DIR (an existing, empty scratch directory). */
#include <ctxstore.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define N_LAYERS 2
#define N_KV_HEADS 2
#define HEAD_DIM 8
#define N_TOKENS 3
#define TOKEN_ELEMS (N_LAYERS * N_KV_HEADS * HEAD_DIM)

static int check(int rc, const char *what)
{
    if (rc < 0)
        fprintf(stderr, "install_app: %s: %s (%s)\n", what, ctxs_strerror(rc),
                ctxs_err_name(rc));
    return rc < 0;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: install_app DIR\n");
        return 2;
    }
    char path[4096];
    if (snprintf(path, sizeof path, "%s/app.ctxs", argv[1]) >= (int)sizeof path)
        return 2;

    ctxs_model model = { .geometry = { N_LAYERS, N_KV_HEADS, HEAD_DIM, CTXS_DTYPE_F16 } };
    memcpy(model.model_hash, "install-test-mod", 16);
    ctxs_create_options opts = CTXS_CREATE_OPTIONS_INIT;
    opts.capacity = 16;
    opts.n_sink = 1;

    /* fp16 bit patterns; only their bytes matter here. */
    uint16_t k[N_TOKENS][TOKEN_ELEMS], v[N_TOKENS][TOKEN_ELEMS];
    for (int t = 0; t < N_TOKENS; t++)
        for (int e = 0; e < TOKEN_ELEMS; e++) {
            k[t][e] = (uint16_t)(0x3c00 + t * 64 + e);
            v[t][e] = (uint16_t)(0xbc00 + t * 64 + e);
        }
    const uint32_t ids[N_TOKENS] = { 101, 102, 103 };

    int failed = 1;
    ctxs_session *s = NULL;
    ctxs_reservation r;
    if (check(ctxs_session_create(&s, path, &model, &opts), "create") ||
        check(ctxs_session_reserve(&r, s, N_TOKENS), "reserve"))
        goto leave;
    for (uint32_t i = 0; i < N_TOKENS; i++)
        if (check(ctxs_session_write_token(s, &r, i, k[i], v[i], CTXS_DTYPE_F16), "write_token"))
            goto leave;
    if (check(ctxs_session_commit(s, ids, N_TOKENS), "commit"))
        goto leave;
    ctxs_session_close(s);
    s = NULL;

    ctxs_session_info info;
    uint16_t k_back[TOKEN_ELEMS], v_back[TOKEN_ELEMS];
    if (check(ctxs_session_open(&s, path, &model, 0, NULL), "reopen") ||
        check(ctxs_session_get_info(&info, s), "info_get") ||
        check(ctxs_session_read_token(k_back, v_back, s, 1, CTXS_DTYPE_F16), "read_token"))
        goto leave;
    if (info.n_tokens != N_TOKENS) {
        fprintf(stderr, "install_app: reopened with %llu tokens, committed %d\n",
                (unsigned long long)info.n_tokens, N_TOKENS);
        goto leave;
    }
    if (memcmp(k_back, k[1], sizeof k_back) || memcmp(v_back, v[1], sizeof v_back)) {
        fprintf(stderr, "install_app: token 1 read back differs\n");
        goto leave;
    }
    printf("install_app: %llu tokens committed, reopened, read back\n",
           (unsigned long long)info.n_tokens);
    failed = 0;

leave:
    ctxs_session_close(s);
    unlink(path);
    return failed;
}
