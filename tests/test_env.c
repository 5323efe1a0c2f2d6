/* Settings from the environment read through a cache (src/internal.h):
 * ab__env_choice_cached reads its variable once a generation, keeps any
 * int (negative ones too), runs its resolve step once a generation, and a
 * malformed value gives the default and one log line a generation, not
 * one a call. The variables are the test's own; each test runs in a
 * process of its own. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

#define NAME "AB_TEST_ENV_CHOICE"

static const struct ab__env_choice choices[] = {
    {"auto", -1}, {"low", INT_MIN}, {"minus2", -2}, {"zero", 0}, {"high", INT_MAX}, {NULL, 0}};

static int read_choice(ab__env_cache *c) { return ab__env_choice_cached(c, NAME, choices, -1, "a test word", NULL); }

Test(env, kept_words_give_back_every_int) {
  const int values[] = {0, 1, 2, 1000, INT_MAX, -1, -2, -1000, INT_MIN + 1, INT_MIN};
  for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
    ab__env_cache c = 0;
    const uint32_t kept = ab__env_keep(&c, (uint32_t)values[i]);
    uint32_t v;
    cr_assert(ab__env_cached(&c, &v), "value %d: not cached", values[i]);
    cr_assert_eq(v, kept);
    cr_assert_eq(ab__env_int_of(v), values[i], "value %d came back as %d", values[i], ab__env_int_of(v));
  }
}

Test(env, a_choice_is_read_once_a_generation) {
  static ab__env_cache c;
  const struct {
    const char *word;
    int value;
  } cases[] = {{"low", INT_MIN}, {"minus2", -2}, {"zero", 0}, {"high", INT_MAX}, {"auto", -1}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    cr_assert_eq(setenv(NAME, cases[i].word, 1), 0);
    ab__env_reload();
    cr_assert_eq(read_choice(&c), cases[i].value, "%s: want %d, got %d", cases[i].word, cases[i].value,
                 read_choice(&c));
    /* a new value without a reload is not seen: the cache answers */
    cr_assert_eq(setenv(NAME, cases[(i + 1) % 5].word, 1), 0);
    cr_assert_eq(read_choice(&c), cases[i].value, "%s: read again before the reload", cases[i].word);
  }
  cr_assert_eq(unsetenv(NAME), 0);
  ab__env_reload();
  cr_assert_eq(read_choice(&c), -1, "unset: the default");
}

static int resolved;
/* auto (-1) becomes 7; the count shows how often it ran */
static int resolve_auto(int v) {
  resolved++;
  return v == -1 ? 7 : v;
}

Test(env, the_resolve_step_runs_once_a_generation) {
  static ab__env_cache c;
  cr_assert_eq(unsetenv(NAME), 0);
  ab__env_reload();
  for (int k = 0; k < 5; k++)
    cr_assert_eq(ab__env_choice_cached(&c, NAME, choices, -1, "a test word", resolve_auto), 7);
  cr_assert_eq(resolved, 1, "resolved %d times in one generation", resolved);
  cr_assert_eq(setenv(NAME, "minus2", 1), 0);
  ab__env_reload();
  for (int k = 0; k < 5; k++)
    cr_assert_eq(ab__env_choice_cached(&c, NAME, choices, -1, "a test word", resolve_auto), -2);
  cr_assert_eq(resolved, 2, "resolved %d times in two generations", resolved);
}

Test(env, a_malformed_value_gives_the_default_and_one_line_a_generation, .init = cr_redirect_stderr) {
  static ab__env_cache c;
  cr_assert_eq(setenv(NAME, "bogus", 1), 0);
  ab__env_reload();
  for (int k = 0; k < 3; k++) cr_assert_eq(read_choice(&c), -1, "a malformed value is the default");
  fflush(stderr);
  cr_assert_stderr_eq_str("arraybridge error: " NAME "=\"bogus\" ignored: want a test word; using auto\n");
}

/* The first read of a generation by two caches of one variable, or by
 * threads at once (a host move's workers each reading a setting for the
 * first time), logged the line once for each: AB_HOST_F16C=bogus printed
 * it twice in a two-thread cast. A new generation logs it again. */
Test(env, a_malformed_value_is_logged_once_by_two_caches_and_again_after_a_reload, .init = cr_redirect_stderr) {
  static ab__env_cache a, b;
  cr_assert_eq(setenv(NAME, "bogus", 1), 0);
  ab__env_reload();
  cr_assert_eq(read_choice(&a), -1);
  cr_assert_eq(read_choice(&b), -1);
  ab__env_reload();
  cr_assert_eq(read_choice(&a), -1);
  cr_assert_eq(read_choice(&b), -1);
  fflush(stderr);
  cr_assert_stderr_eq_str("arraybridge error: " NAME "=\"bogus\" ignored: want a test word; using auto\n"
                          "arraybridge error: " NAME "=\"bogus\" ignored: want a test word; using auto\n");
}

/* Twenty generations, in each eight threads calling read() at once for
 * its first read of the generation: each must get `want`, and stderr must
 * hold `line` once a generation. */
static pthread_barrier_t at_once;
static int (*reader)(void);
static void *read_at_once(void *arg) {
  (void)arg;
  pthread_barrier_wait(&at_once);
  return (void *)(intptr_t)reader();
}
static void read_by_eight_threads_at_once(int (*read)(void), int want, const char *line) {
  reader = read;
  for (int round = 0; round < 20; round++) {
    ab__env_reload();
    pthread_t t[8];
    cr_assert_eq(pthread_barrier_init(&at_once, NULL, 8), 0);
    for (int i = 0; i < 8; i++) cr_assert_eq(pthread_create(&t[i], NULL, read_at_once, NULL), 0);
    for (int i = 0; i < 8; i++) {
      void *v;
      cr_assert_eq(pthread_join(t[i], &v), 0);
      cr_assert_eq((int)(intptr_t)v, want);
    }
    pthread_barrier_destroy(&at_once);
  }
  fflush(stderr);
  FILE *f = cr_get_redirected_stderr();
  char got[256];
  int lines = 0;
  while (fgets(got, sizeof got, f) != NULL) {
    cr_assert_str_eq(got, line);
    lines++;
  }
  cr_assert_eq(lines, 20, "%d lines for 20 generations", lines);
}

static ab__env_cache shared_cache;
static int read_shared(void) { return read_choice(&shared_cache); }

Test(env, a_malformed_value_read_by_eight_threads_at_once_is_logged_once, .init = cr_redirect_stderr) {
  cr_assert_eq(setenv(NAME, "bogus", 1), 0);
  read_by_eight_threads_at_once(read_shared, -1,
                                "arraybridge error: " NAME "=\"bogus\" ignored: want a test word; using auto\n");
}

/* AB_LOG_LEVEL's own line (log.c prints it, not ab__env_choice) likewise. */
Test(env, a_malformed_log_level_read_by_eight_threads_at_once_is_logged_once, .init = cr_redirect_stderr) {
  cr_assert_eq(setenv("AB_LOG_LEVEL", "bogus", 1), 0);
  read_by_eight_threads_at_once(ab__log_level, AB_LOG_WARN,
                                "arraybridge: AB_LOG_LEVEL=\"bogus\" is not one of off, error, warn, info, debug "
                                "(0-4); using warn\n");
}

/* The value went into the line raw: a newline or a terminal's escape
 * codes in it were written to the caller's stderr as they were. */
Test(env, a_malformed_value_is_logged_cut_and_printable, .init = cr_redirect_stderr) {
  static ab__env_cache c;
  cr_assert_eq(setenv(NAME, "bo\ngus\x1b[2J 0123456789012345678901234567890123456789", 1), 0);
  ab__env_reload();
  cr_assert_eq(read_choice(&c), -1);
  cr_assert_eq(setenv(NAME, "\t7", 1), 0);
  ab__env_reload();
  cr_assert_eq(ab__env_int(NAME, 3, 0, 9), 3);
  cr_assert_eq(ab__env_size(NAME, 8, 1, 64, "8KiB"), 8);
  fflush(stderr);
  cr_assert_stderr_eq_str("arraybridge error: " NAME "=\"bo?gus?[2J 01234567890123456789012345678...\" ignored: want a "
                          "test word; using auto\n"
                          "arraybridge error: " NAME "=\"?7\" ignored: want 0..9; using 3\n"
                          "arraybridge error: " NAME "=\"?7\" ignored: want a size from 1 to 64 bytes (e.g. 8KiB); "
                          "using 8\n");
}

Test(env, a_switch_reads_on_off_and_its_default) {
  static ab__env_cache c;
  const struct {
    const char *word; /* NULL: unset */
    int dflt;
    bool want;
  } cases[] = {{"1", 0, true}, {"on", 0, true}, {"0", 1, false}, {"off", 1, false}, {NULL, 1, true}, {NULL, 0, false}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    if (cases[i].word != NULL) cr_assert_eq(setenv(NAME, cases[i].word, 1), 0);
    else cr_assert_eq(unsetenv(NAME), 0);
    ab__env_reload();
    cr_assert_eq(ab__env_switch(&c, NAME, cases[i].dflt), cases[i].want, "case %zu (%s, default %d)", i,
                 cases[i].word != NULL ? cases[i].word : "unset", cases[i].dflt);
  }
}
