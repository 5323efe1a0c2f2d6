/* Replays fuzz inputs without libFuzzer (as zstd's regression driver):
 * every file named on the command line, or every file in a named
 * directory, goes through LLVMFuzzerTestOneInput once. Exit 0 when all ran;
 * a failing input aborts (the target traps). */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    perror(path);
    return 1;
  }
  uint8_t *buf = NULL;
  size_t len = 0, cap = 0, n;
  uint8_t chunk[4096];
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
    if (len + n > cap) {
      cap = (len + n) * 2;
      uint8_t *p = realloc(buf, cap);
      if (p == NULL) {
        free(buf);
        fclose(f);
        return 1;
      }
      buf = p;
    }
    memcpy(buf + len, chunk, n);
    len += n;
  }
  fclose(f);
  LLVMFuzzerTestOneInput(buf ? buf : (const uint8_t *)"", len);
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  int files = 0, errors = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      perror(argv[i]);
      return 1;
    }
    if (S_ISDIR(st.st_mode)) {
      DIR *d = opendir(argv[i]);
      if (d == NULL) {
        perror(argv[i]);
        return 1;
      }
      for (;;) {
        errno = 0;
        struct dirent *e = readdir(d);
        if (e == NULL) {
          if (errno != 0) { /* not the end: EOVERFLOW, say, on 32 bits */
            perror(argv[i]);
            closedir(d);
            return 1;
          }
          break;
        }
        if (e->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
        errors += run_file(path);
        files++;
      }
      closedir(d);
    } else {
      errors += run_file(argv[i]);
      files++;
    }
  }
  printf("replayed %d inputs, %d unreadable\n", files, errors);
  return errors != 0 || files == 0;
}
