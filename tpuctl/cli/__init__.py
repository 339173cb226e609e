"""Click commands: parse options, call one library function, render the result."""
