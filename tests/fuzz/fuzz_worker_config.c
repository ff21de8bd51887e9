/* fuzz_worker_config.c - libFuzzer target for what a worker parses from the
 * server: TRAINYARD_CONFIG, the assignment's config the agent passes on
 * (executor/worker.c config_parse and parse_hostport, reached by
 * #including worker.c: they are static). Accepted configs must give sane
 * ports, counts and a spec that parses back as JSON.
 * docs/reliability.md, "Fuzzing". */
#include "executor/worker.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) abort();
    memcpy(text, data, size);
    text[size] = '\0';
    wconfig w;
    char err[256] = "";
    int rc = config_parse(text, &w, err, sizeof err);
    if (rc == 0) {
        if (w.n_workers < 1 || w.n_workers > COMM_MAX_RANKS || w.n_ps < 0 || w.n_ps > PS_MAX || w.threads < 1)
            abort();
        for (int i = 0; i < w.n_workers; i++)
            if (w.worker_port[i] < 0 || w.worker_port[i] > 65535 || strlen(w.worker_addr[i]) >= COMM_ADDR_MAX)
                abort();
        for (int i = 0; i < w.n_ps; i++)
            if (w.ps[i].port <= 0 || w.ps[i].port > 65535) abort();
        cJSON *spec = cJSON_Parse(w.spec_json);
        if (!cJSON_IsObject(spec)) abort();
        cJSON_Delete(spec);
    } else if (!err[0]) {
        abort();
    }
    free(w.spec_json);
    free(w.worker_addr);
    free(w.worker_port);
    free(w.ps);
    free(text);
    return 0;
}
