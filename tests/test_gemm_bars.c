/* The GEMM acceptance bars that `k3 bench gemm` prints (tools/gemm_bars.c), on synthetic points whose verdicts
 * are known: each bar's PASS/FAIL edge, the by-M geometric mean, and the lists of missing points. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "gemm_bars.h"
#include "test_util.h"

/* Prints b into a buffer; returns the number of failed bars. */
static int render(const k3b_bars *b, char *buf, size_t size) {
    FILE *f = tmpfile();
    if (!f) return -1;
    const int failed = k3b_bars_print(b, f);
    rewind(f);
    const size_t got = fread(buf, 1, size - 1, f);
    buf[got] = 0;
    fclose(f);
    return failed;
}

int main(void) {
    char out[4096];
    k3b_bars b;

    /* all bars met: 144x7168 at 3.0 us exactly, 1536x128 at the two edges, big shape at 85.0%, speedup 1.5x */
    k3b_bars_init(&b);
    k3b_bars_add(&b, 144, 7168, 16, 3.0, 4.5, 20.0);
    k3b_bars_add(&b, 1536, 128, 8, 1.2, 1.8, 8.0);
    k3b_bars_add(&b, 1536, 128, 16, 1.5, 2.25, 7.0);
    k3b_bars_add(&b, 3584, 7168, 8, 10.0, 15.0, 85.0);
    k3b_bars_add(&b, 3584, 7168, 12, 10.0, 15.0, 70.0); /* M 12: not under the 85% bar */
    int failed = render(&b, out, sizeof out);
    CHECK(failed == 0, "all met: %d failed bars\n%s", failed, out);
    CHECK(strstr(out, "geometric-mean speedup >= 1.35x") && strstr(out, "PASS (1.500x over the 5 points"),
          "geomean line:\n%s", out);
    CHECK(strstr(out, "M8 1.500") && strstr(out, "M12 1.500") && strstr(out, "M16 1.500"), "by M:\n%s", out);
    CHECK(strstr(out, "(0 of 1 points under)"), "big-shape count:\n%s", out);

    /* each bar missed once, just over its edge */
    k3b_bars_init(&b);
    k3b_bars_add(&b, 144, 7168, 12, 3.01, 6.0, 17.0);
    k3b_bars_add(&b, 144, 7168, 1, 2.5, 6.0, 19.0);
    k3b_bars_add(&b, 1536, 128, 8, 1.21, 2.8, 7.9);
    k3b_bars_add(&b, 1536, 128, 12, 1.49, 2.8, 7.5);
    k3b_bars_add(&b, 3584, 7168, 1, 13.9, 17.3, 84.6);
    k3b_bars_add(&b, 2112, 7168, 1, 9.0, 9.0, 60.0); /* 30 MB: not a big shape; under its own 82% */
    failed = render(&b, out, sizeof out);
    CHECK(failed == 4, "four bars missed (geomean passes): %d\n%s", failed, out);
    CHECK(strstr(out, "2112x7168 >= 82% at M <= 8: FAIL (1 of 1 points under: 2112x7168 M1 60.0%)"),
          "small-M shapes line:\n%s", out);
    CHECK(strstr(out, "144x7168 <= 3.0 us at M <= 16: FAIL (worst 3.01 us at M 12; over: M12 3.01 us)"),
          "144x7168 line:\n%s", out);
    CHECK(strstr(out, "1536x128") && strstr(out, "FAIL (1 of 2 points over: M8 1.21 us)"), "1536x128 line:\n%s",
          out);
    CHECK(strstr(out, "FAIL (1 of 1 points under: 3584x7168 M1 84.6%)"), "big-shape line:\n%s", out);

    /* the small-M shapes' edges: 1536x7168 76% at M 8, 70% at M 12 and 16, nothing asked at M 9-11; 2112x7168 82% at
     * M 8 and nothing past it */
    k3b_bars_init(&b);
    k3b_bars_add(&b, 1536, 7168, 8, 6.6, 9.9, 76.0); /* 1.5x cuBLASLt everywhere */
    k3b_bars_add(&b, 1536, 7168, 12, 7.2, 10.8, 70.0);
    k3b_bars_add(&b, 1536, 7168, 10, 9.0, 13.5, 55.0);
    k3b_bars_add(&b, 2112, 7168, 8, 8.4, 12.6, 82.0);
    k3b_bars_add(&b, 2112, 7168, 16, 10.4, 15.6, 67.0);
    failed = render(&b, out, sizeof out);
    CHECK(failed == 0 && strstr(out, "2112x7168 >= 82% at M <= 8: PASS (0 of 3 points under)"),
          "small-M shapes at their edges: %d\n%s", failed, out);
    k3b_bars_add(&b, 1536, 7168, 16, 7.3, 10.95, 69.9);
    k3b_bars_add(&b, 1536, 7168, 1, 6.7, 10.05, 75.9);
    failed = render(&b, out, sizeof out);
    CHECK(failed == 1 && strstr(out, "FAIL (2 of 5 points under: 1536x7168 M16 69.9%, 1536x7168 M1 75.9%)"),
          "small-M shapes just under: %d\n%s", failed, out);

    /* geomean just under the bar; no shape-specific bars when those shapes were not measured */
    k3b_bars_init(&b);
    k3b_bars_add(&b, 6144, 7168, 4, 10.0, 13.49, 90.0);
    failed = render(&b, out, sizeof out);
    CHECK(failed == 1 && strstr(out, "FAIL (1.349x"), "geomean 1.349x fails:\n%s", out);
    CHECK(!strstr(out, "144x7168") && !strstr(out, "1536x128") && !strstr(out, "2112x7168"),
          "unmeasured bars not printed:\n%s", out);

    /* a point more than 2% slower than cuBLASLt fails that bar and is listed; one 1% slower does not */
    k3b_bars_init(&b);
    k3b_bars_add(&b, 7168, 3584, 12, 15.58, 15.21, 75.8);
    k3b_bars_add(&b, 7168, 3584, 16, 10.1, 10.0, 75.0);
    failed = render(&b, out, sizeof out);
    CHECK(failed == 2 && b.slow_misses == 1, "one slower point (and the geomean under 1.35x): %d\n%s", failed, out);
    CHECK(strstr(out, "bar: no point slower than cuBLASLt by > 2%: FAIL") &&
              !strcmp(b.slow_list, "7168x3584 M=12 (15.58 vs 15.21 us)"),
          "slower line and list:\n%s\n%s", out, b.slow_list);

    /* points without a cuBLASLt time are not counted */
    k3b_bars_init(&b);
    k3b_bars_add(&b, 144, 7168, 1, 2.0, 0.0, 20.0);
    CHECK(b.n_points == 0 && b.tiny_points == 0, "a point without cuBLASLt is skipped");
    return k3t_finish();
}
