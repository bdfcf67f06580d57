/* Minimal pause (the pod sandbox's init): sleep forever, reap zombies, exit 0 on SIGINT/SIGTERM. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
static void sigdown(int s) { (void)s; _exit(0); }
static void sigreap(int s) { (void)s; while (waitpid(-1, NULL, WNOHANG) > 0) {} }
int main(void) {
  struct sigaction d = {.sa_handler = sigdown}, r = {.sa_handler = sigreap, .sa_flags = SA_NOCLDSTOP};
  sigaction(SIGINT, &d, NULL); sigaction(SIGTERM, &d, NULL); sigaction(SIGCHLD, &r, NULL);
  for (;;) pause();
}
