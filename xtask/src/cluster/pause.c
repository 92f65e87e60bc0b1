/* The pod sandbox's process (what the kubelet's pause image runs): holds the pod's namespaces,
 * reaps the zombies of processes that share its PID namespace, exits on SIGINT or SIGTERM. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int sig) { _exit(0); }

static void reap(int sig) {
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
}

int main(void) {
	struct sigaction q = {.sa_handler = quit}, r = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
	if (getpid() != 1)
		return 1;
	if (sigaction(SIGINT, &q, NULL) || sigaction(SIGTERM, &q, NULL) || sigaction(SIGCHLD, &r, NULL))
		return 2;
	for (;;)
		pause();
}
