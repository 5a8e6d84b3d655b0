/* The k3 command-line tool: one file per command (tools/cmd_<name>.c), shared helpers in tools/cli_util.c. */
#ifndef K3_TOOLS_CLI_H
#define K3_TOOLS_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "k3.h"

/* Exit codes of every command. */
enum { K3_EXIT_OK = 0, K3_EXIT_FAIL = 1, K3_EXIT_USAGE = 2 };

typedef struct k3_cli_command {
    const char *name;
    const char *summary;                 /* one line for `k3 --help` */
    int (*run)(int argc, char **argv);   /* argv[0] is the command name */
} k3_cli_command;

int k3_cmd_info(int argc, char **argv);
int k3_cmd_quant(int argc, char **argv);   /* also serves `dequant` (argv[0] says which) */
int k3_cmd_run(int argc, char **argv);
int k3_cmd_demo(int argc, char **argv);
int k3_cmd_plan(int argc, char **argv);
int k3_cmd_plan_moe(int argc, char **argv); /* `k3 plan --moe` (tools/cmd_plan_moe.c) */
int k3_cmd_plan_latent(int argc, char **argv); /* `k3 plan --latent` (tools/cmd_plan_latent.c) */
int k3_cmd_bench(int argc, char **argv);
int k3_cmd_tune(int argc, char **argv);
int k3_cmd_convert(int argc, char **argv);
/* `k3 bench kda` (tools/kda_bench.c), dispatched from k3_cmd_bench. */
int k3_bench_kda(int argc, char **argv);

/* ---- helpers (tools/cli_util.c) ---- */
/* 1 when argv[i] is "-h" or "--help" for any i >= 1. */
int k3_cli_wants_help(int argc, char **argv);
/* Returns the value following option `name` at argv[*i] (advancing *i), or NULL after printing an error. */
const char *k3_cli_value(int argc, char **argv, int *i, const char *name);
/* Strict number parsers: the whole string must parse; print an error naming `what` and return 0 on failure. */
int k3_cli_parse_i64(const char *s, const char *what, int64_t *out);
int k3_cli_parse_f32(const char *s, const char *what, float *out);
/* Parses "1,2,4" or "1-16" or "1-4,8,16" into out[] (at most cap), returns the count, 0 on error. */
int k3_cli_parse_list(const char *s, const char *what, int64_t *out, int cap);
/* 1 when s names a backend ("cpu", "cuda", "auto"); else prints a usage error for option `what` and returns 0. */
int k3_cli_device_name_ok(const char *s, const char *what);
/* A CPU context simulating compute capability `arch` ("MAJOR.MINOR") with sm_count SMs (0: the architecture
 * table's key); NULL after printing a message prefixed by cmd, with *usage set when `arch` itself was bad. */
k3_ctx *k3_cli_sim_ctx(const char *cmd, const char *arch, int32_t sm_count, int *usage);
/* 1 when paths a and b name the same file: the same string, or the same device and inode (a link, "./x"). */
int k3_cli_same_file(const char *a, const char *b);
/* Creates a context for "cpu", "cuda" or "auto"; prints the failure and returns NULL on error. */
k3_ctx *k3_cli_ctx(const char *device);

/* ---- JSON output (tools/cli_util.c) ---- */
/* Writes s as a JSON string: quotes, backslash and control characters escaped, other bytes as they are (names
 * come from files whose reader checked them as UTF-8); NULL is written as null. */
void k3_cli_json_string(FILE *f, const char *s);
/* Writes v as a JSON number (%.17g keeps every double), or null when v is NaN or infinite (JSON has neither). */
void k3_cli_json_number(FILE *f, double v);
/* Seconds on the monotonic clock. */
double k3_cli_now(void);

/* ---- progress lines on stderr (tools/cli_util.c) ---- */
typedef struct k3_cli_progress {
    const char *cmd;   /* "k3 quant" */
    double start, last;
    double after;      /* seconds before the first line; a negative value: never */
} k3_cli_progress;
/* Starts the clock: lines begin once `after` seconds have passed (a negative value turns them off). */
void k3_cli_progress_init(k3_cli_progress *p, const char *cmd, double after);
/* "CMD: tensor I of N: NAME" once the command has run `after` seconds, then at most two lines a second (every
 * item when after is 0). i counts from 1. */
void k3_cli_progress_item(k3_cli_progress *p, int64_t i, int64_t n, const char *name);
/* "CMD: STEP" under the same rule, for a step between items (writing the output file). */
void k3_cli_progress_step(k3_cli_progress *p, const char *step);

#endif
