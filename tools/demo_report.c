/* k3 demo --json: the report object (times in ms and s, byte counts, the correctness verdict). */
#include "demo_report.h"

#include <stdio.h>

#include "cli.h"

static const char *json_bool(int v) { return v ? "true" : "false"; }

static void shape_print(const k3_demo_shape *s) {
    printf("{\"experts\": %d, \"top_k\": %d, \"hidden\": %lld, \"latent\": %lld, \"inter\": %lld, "
           "\"shared_inter\": %lld}",
           (int)s->e, (int)s->k, (long long)s->h, (long long)s->l, (long long)s->i, (long long)s->is);
}

void k3_demo_report_print(const k3_demo_report *r) {
    static const char *const stage[K3_DEMO_STAGES] = {"router_ms", "down_ms", "experts_ms", "norm_up_ms",
                                                      "shared_ms"};
    printf("{\"command\": \"demo\", \"backend\": ");
    k3_cli_json_string(stdout, r->backend);
    printf(", \"device\": ");
    k3_cli_json_string(stdout, r->device);
    printf(", \"cpu_fallback\": %s, \"seed\": %llu, \"format\": \"nvfp4\", \"scale_layout\": \"linear\", "
           "\"mode\": \"w4a16\", \"shape\": ",
           json_bool(r->fell_back), (unsigned long long)r->seed);
    shape_print(&r->shape);
    printf(", \"weights_seconds\": ");
    k3_cli_json_number(stdout, r->synth_s);
    printf(", \"weights_bytes_fp4\": %.0f, \"weights_bytes_dense\": %.0f, \"copy_seconds\": ", r->bytes_fp4,
           r->bytes_dense);
    if (r->copy_s >= 0) k3_cli_json_number(stdout, r->copy_s);
    else fputs("null", stdout);
    if (r->graph) printf(", \"copies\": %d, \"reps\": %lld", (int)r->copies, (long long)r->reps);
    printf(", \"m\": [");
    for (int i = 0; i < r->nm; i++) printf("%s%lld", i ? ", " : "", (long long)r->m[i]);
    printf("], \"runs\": [");
    for (int i = 0; i < r->nm; i++) {
        if (r->graph) { /* the row of `k3 bench block --json` */
            if (i) fputs(", ", stdout);
            k3_bench_block_row_json(stdout, &r->pt[i]);
            continue;
        }
        printf("%s{\"m\": %lld", i ? ", " : "", (long long)r->m[i]);
        for (int s = 0; s < K3_DEMO_STAGES; s++) {
            printf(", \"%s\": ", stage[s]);
            if (r->has_stages) k3_cli_json_number(stdout, r->stage_ms[i][s]);
            else fputs("null", stdout);
        }
        printf(", \"total_ms\": ");
        k3_cli_json_number(stdout, r->total_ms[i]);
        putchar('}');
    }
    const k3_demo_check *c = &r->check;
    printf("], \"correctness\": ");
    if (!c->ran) {
        fputs("null", stdout);
    } else {
        printf("{\"against\": \"%s\", \"shape\": ", c->against_cpu ? "cpu reference backend" : "token by token");
        shape_print(&c->shape);
        printf(", \"m\": %lld, \"%s\": %s, \"finite\": %s, \"rel_l2\": ", (long long)c->m,
               c->against_cpu ? "ids_identical" : "bitwise_identical", json_bool(c->ids_identical),
               json_bool(c->finite));
        if (c->against_cpu) k3_cli_json_number(stdout, c->rel_l2);
        else fputs("null", stdout);
        printf(", \"bar\": ");
        if (c->against_cpu) k3_cli_json_number(stdout, c->bar);
        else fputs("null", stdout);
        printf(", \"pass\": %s}", json_bool(c->pass));
    }
    printf(", \"total_seconds\": ");
    k3_cli_json_number(stdout, r->total_s);
    printf(", \"pass\": %s}\n", json_bool(r->pass));
}
