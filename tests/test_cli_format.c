/*
 * The tool's formats of sizes and durations: three digits, never an
 * exponent, and the unit that keeps the value below 1000 once rounded.
 */
#include <criterion/criterion.h>

#include "cli.h"

static void expect_duration(double seconds, const char *text)
{
    char buf[32];
    cr_expect_str_eq(fmt_duration(buf, seconds), text, "%.9g s", seconds);
}

Test(cli_format, durations_round_into_the_next_unit)
{
    expect_duration(0, "0 ns");
    expect_duration(-1, "0 ns");
    expect_duration(12e-9, "12 ns");
    expect_duration(999.4e-9, "999 ns");
    expect_duration(999.6e-9, "1 us");
    expect_duration(12.34e-6, "12.3 us");
    expect_duration(999.6e-6, "1 ms");
    expect_duration(0.0015, "1.5 ms");
    expect_duration(0.9994, "999 ms");
    expect_duration(0.9996, "1 s");
    expect_duration(59.4, "59.4 s");
    expect_duration(61, "1 min 1 s");
    expect_duration(3600, "60 min 0 s");
}

static void expect_size(uint64_t bytes, const char *text)
{
    char buf[32];
    cr_expect_str_eq(fmt_size(buf, bytes), text, "%llu bytes", (unsigned long long)bytes);
}

Test(cli_format, sizes_round_into_the_next_unit)
{
    expect_size(0, "0 B");
    expect_size(1023, "1023 B");
    expect_size(1536, "1.50 KiB");
    expect_size(10235, "10.0 KiB");   /* 9.995 KiB */
    expect_size(102350, "100 KiB");   /* 99.95 KiB */
    expect_size(1048000, "1023 KiB"); /* 1023.4 KiB */
    expect_size(1048100, "1.00 MiB"); /* 1023.5 KiB */
    expect_size((uint64_t)300 << 20, "300 MiB");
    expect_size(UINT64_MAX, "16.0 EiB");
}
