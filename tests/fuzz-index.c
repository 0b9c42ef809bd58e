/* Placeholder: replaced by the fuzz target. */
int main (void) { return 0; }
